"""The README and docs/ stay true: every relative link resolves (to a file, and to a heading
when it names one), every pointer to a named section ("X" below, see "X") finds that heading
where it says, every `python ...` command they quote names a script that exists with options
its own parser accepts, and a figure quoted in two places is the same figure, its JSON's."""
import glob
import importlib
import os
import re
import shlex

import pytest

from mingpt_rlhf.cli import build_parser
from test_scripts import ROOT

PAGES = ([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "bench", "peers", "README.md")]
         + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))
SCRIPTS = ("train_sft", "train_rm", "train_ppo", "train_dpo", "sample")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path: str) -> list[tuple[int, str]]:
    """(line index, text) of each heading of a Markdown file, code blocks skipped."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, fenced = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            found.append((i, line.lstrip("#").strip()))
    return found


def anchors(path: str) -> set:
    """Every heading's anchor; GitHub gives a repeated heading -1, -2, ... after its slug."""
    seen, out = {}, set()
    for _, heading in headings(path):
        s = slug(heading)
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out


def prose(text: str) -> str:
    """The page as a reader follows it: code blocks out (their line breaks kept), and inline
    code that shows a link's or a pointer's syntax (`[X](#x)`, `"X" below`) made inert."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*(?:\]\(|\")[^`\n]*`", "code", text)


def links(path: str):
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1)
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(page):
    found = list(links(page))
    for target in found:
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        assert os.path.exists(full), f"{os.path.relpath(page, ROOT)}: {target} does not exist"
        if anchor:
            assert anchor in anchors(full), f"{os.path.relpath(page, ROOT)}: no heading #{anchor} in {path or 'itself'}"
    if page == PAGES[0]:
        assert len(found) >= 10  # the README points into docs/


def commands(path: str) -> list[list[str]]:
    """Every `python ...` command in the page's code blocks, as argument lists (continuation
    lines joined, `a && b` split, comments dropped)."""
    with open(path, encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), flags=re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value before the command
                if words[:1] == ["torchrun"]:
                    words = ["python"] + [w for w in words if w.endswith(".py")][:1] + \
                        words[next(i for i, w in enumerate(words) if w.endswith(".py")) + 1:]
                if words[:1] == ["python"]:
                    out.append(words[1:])
    return out


def check_command(args: list[str], page: str):
    where = f"{os.path.relpath(page, ROOT)}: python {' '.join(args)}"
    if args[:2] == ["-m", "pytest"]:
        return
    if args[:2] in (["-m", "mingpt_rlhf.plot"], ["-m", "mingpt_rlhf.report"]):
        importlib.import_module(args[1]).build_parser().parse_args(args[2:])
        return
    script = args[0]
    assert os.path.isfile(os.path.join(ROOT, script)), f"{where}: no {script}"
    name = os.path.splitext(script)[0]
    if name in SCRIPTS:  # options parsed with the script's own parser
        module = importlib.import_module(name)
        build_parser(module.Config).parse_args(args[1:])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_quoted_command_names_a_script_and_options_that_exist(page):
    found = commands(page)
    for args in found:
        check_command(args, page)
    if page == PAGES[0]:
        assert len(found) >= 10


def plain(text: str) -> str:
    """A heading or a quoted name as a reader compares them: no backticks, one space, lower case."""
    return " ".join(text.replace("`", "").split()).lower()


# "X" below / see "X" (above) / below ([X](#anchor)) / [X](#anchor) above: a named section
NAMED = re.compile(r'(?:see )?"(?P<name>[^"]{3,80})"\)? ?\(?(?P<where>below|above)\b'
                   r'|see "(?P<seen>[^"]{3,80})"'
                   r'|(?P<before>below|above) \(?\[[^\]]+\]\(#(?P<a1>[^)]+)\)'
                   r'|\[[^\]]+\]\(#(?P<a2>[^)]+)\)\)? (?P<after>below|above)\b')


def section_pointers(path: str):
    """(line index, the pointer's text, a heading's name or None, its #anchor or None,
    'below' / 'above' / None) for each pointer to a named section of the same page."""
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    for m in NAMED.finditer(text):
        line = text.count("\n", 0, m.start())
        name = m.group("name") or m.group("seen")
        anchor = m.group("a1") or m.group("a2")
        where = m.group("where") or m.group("before") or m.group("after")
        yield line, " ".join(m.group(0).split()), name and " ".join(name.split()), anchor, where


def pointer_problems(path: str) -> list[str]:
    """What is wrong with the page's pointers to its own sections: a name no heading begins
    with, an anchor no heading has, a heading on the other side of the pointer."""
    problems = []
    heads = headings(path)
    for line, said, name, anchor, where in section_pointers(path):
        if name is not None:
            found = [i for i, h in heads if plain(h).startswith(plain(name))]
        else:
            found = [i for i, h in heads if slug(h) == anchor]
        if not found:
            problems.append(f"line {line + 1}: {said!r}: no such heading in this page")
        elif where == "below" and not any(i > line for i in found):
            problems.append(f"line {line + 1}: {said!r}: the heading is above, not below")
        elif where == "above" and not any(i < line for i in found):
            problems.append(f"line {line + 1}: {said!r}: the heading is below, not above")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_pointer_to_a_named_section_finds_it_where_it_says(page):
    """"X" below, see "X", [X](#x) above: the page has a heading that begins with X (or has
    that anchor), on the side the pointer says."""
    assert not pointer_problems(page), pointer_problems(page)


def test_the_pointer_checker_catches_a_wrong_direction_and_a_missing_section(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('# Top\n\nSee "The end" below, "Top" above, [the end](#the-end-at-last) below.\n'
                    '"Nowhere" below; "Top" below; [top](#top) below.\n'
                    'Syntax shown as code is no pointer: `[x](#x) above`, `"X" below`.\n'
                    '\n## The end at last\n')
    problems = pointer_problems(str(page))
    assert len(problems) == 3, problems
    assert "'\"Nowhere\" below': no such heading" in problems[0]
    assert "'\"Top\" below': the heading is above" in problems[1]
    assert "'[top](#top) below': the heading is above" in problems[2]


def test_the_checker_catches_a_wrong_option_and_a_missing_script():
    from mingpt_rlhf.errors import UserError
    with pytest.raises(UserError):
        check_command(["train_ppo.py", "--no_such_option", "1"], PAGES[0])
    with pytest.raises(AssertionError):
        check_command(["train_nothing.py"], PAGES[0])
    assert slug("Which method? PPO, GRPO") == "which-method-ppo-grpo"


def project_files() -> tuple[set, set]:
    """(relative paths, base names) of every file of the project, as git tracks it."""
    import subprocess
    paths = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split())
    return paths, {os.path.basename(p) for p in paths}


CITING = sorted(glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "*.md"))
                + glob.glob(os.path.join(ROOT, "mingpt_rlhf", "*.py"))
                + glob.glob(os.path.join(ROOT, "bench", "*.py")) + glob.glob(os.path.join(ROOT, "docs", "*.md"))
                + glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True))
# the project's own folders: a path under one of them is a citation of the project's file
OWN = r"(?<![\w/.~-])(?:mingpt_rlhf|bench|docs|examples|tests)/[\w/.-]+"


@pytest.mark.parametrize("page", CITING, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_file_cited_exists_in_the_repository(page):
    """A reader who follows a reference finds the file: every `NAME.md` cited anywhere in the
    code and docs, and every path under the project's folders, is a file of the repository."""
    import subprocess
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    paths, names = project_files()
    with open(page, encoding="utf-8") as f:
        text = f.read()
    missing = []
    for m in re.finditer(r"[\w/.-]*\b[\w-]+\.md\b", text):  # any Markdown file named
        cited = m.group(0).lstrip("./")
        here = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(page), cited)), ROOT)
        if cited not in paths and here not in paths and os.path.basename(cited) not in names:
            missing.append(cited)
    for m in re.finditer(OWN, text):
        cited = m.group(0).rstrip(".")
        if cited.endswith("/") or os.path.isdir(os.path.join(ROOT, cited)) or "/." in cited:
            continue  # a folder, or one a tool makes (bench/peers/.venv)
        if cited not in paths and not cited.startswith("bench/results/") and "*" not in cited:
            missing.append(cited)
    assert not missing, f"{os.path.relpath(page, ROOT)} cites files the repository does not hold: {missing}"


# a doc's section cited from code or from another page: docs/NAME.md, "Section"
CITED_SECTION = re.compile(r'(?<![\w/])((?:docs/)?[\w-]+\.md)[,:]? \(?"([^"]{3,80})"')


@pytest.mark.parametrize("page", CITING, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_section_cited_by_name_in_another_file_exists(page):
    with open(page, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    missing = []
    for m in CITED_SECTION.finditer(text):
        cited, name = m.groups()
        target = os.path.join(ROOT, cited if cited.startswith("docs/") or cited == "README.md"
                              else os.path.join("docs", cited))
        if not os.path.exists(target) or not any(
                plain(h).startswith(plain(name)) for _, h in headings(target)):
            missing.append(m.group(0))
    assert not missing, f"{os.path.relpath(page, ROOT)} cites sections that do not exist: {missing}"


def test_the_readmes_benchmark_figures_are_those_in_bench_results():
    """The README quotes bench/results: its method table (algorithms.json) and its multi-turn
    line (multiturn.json) must say what those files hold, rounded as printed."""
    import json
    import re
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "bench", "results", "algorithms.json")) as f:
        summary = json.load(f)["summary"]
    for method, row in [("ppo", "PPO"), ("grpo", "GRPO"), ("rloo", "RLOO"), ("dpo", "DPO")]:
        s = summary[method]
        line = next(l for l in readme.splitlines() if l.startswith(f"| [{row}]"))
        assert f"{s['gold']:.3f} +- {s['gold_stderr']:.3f}" in line, line
        assert f"| {s['kl']:.2f} |" in line, line
    with open(os.path.join(ROOT, "bench", "results", "multiturn.json")) as f:
        multi = json.load(f)["summary"]
    text = " ".join(readme.split())
    found = re.search(r"\((\d\.\d+) guesses, (\d+) % of the games won\), GRPO reaches (\d+)-(\d+) % "
                      r"won in (\d\.\d+)-(\d\.\d+) guesses and PPO (\d+) % in (\d\.\d+)-(\d\.\d+)", text)
    assert found, "the README's multi-turn line changed shape; update this test"
    sft_turns, sft_won, g_lo, g_hi, g_turns_lo, g_turns_hi, p_won, p_lo, p_hi = found.groups()
    g, p, sft = multi["grpo"], multi["ppo"], multi["sft"]
    near = lambda quoted, value, step: abs(float(quoted) - value) <= step / 2 + 1e-9  # rounded
    assert near(sft_turns, sft["turns"]["mean"], 0.01) and near(sft_won, 100 * sft["success"]["mean"], 1)
    assert near(g_lo, 100 * g["success"]["min"], 1) and near(g_hi, 100 * g["success"]["max"], 1)
    assert near(g_turns_lo, g["turns"]["min"], 0.01) and near(g_turns_hi, g["turns"]["max"], 0.01)
    assert near(p_won, 100 * p["success"]["mean"], 1)
    assert near(p_lo, p["turns"]["min"], 0.01) and near(p_hi, p["turns"]["max"], 0.01)


def test_the_readmes_details_line_is_bench_details_json():
    """The README's line on which details matter quotes bench/results/details.json's summary,
    and what it says of the rest is true: which means fall outside the default's seed range,
    and how many stay inside it."""
    import json
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    with open(os.path.join(ROOT, "bench", "results", "details.json")) as f:
        result = json.load(f)
    s, runs = result["summary"], result["runs"]
    base, no_kl = s["baseline"]["gold"], s["no_kl"]["gold"]
    assert (f"the default ends at gold {base['mean']:.3f} ({base['min']:.3f}-{base['max']:.3f}); "
            f"without the KL penalty {no_kl['mean']:.3f} ({no_kl['min']:.3f} to {no_kl['max']:.3f}), "
            f"with an unnormalised reward model {s['rm_unnormalised']['gold']['mean']:.3f}, with a "
            f"critic started from zero {s['critic_from_zero']['gold']['mean']:.3f}, with dropout "
            f"{s['dropout']['gold']['mean']:.3f}") in text
    assert all(v["seeds"] == 3 for k, v in s.items() if k in ("baseline", "no_kl", "dropout"))
    ppo = {k: v["gold"]["mean"] for k, v in s.items() if k != "baseline" and not k.startswith("sort")}
    assert sorted(k for k, g in ppo.items() if g < base["min"]) == ["no_kl", "rm_unnormalised"]
    assert [k for k, g in ppo.items() if g > base["max"]] == ["top_k_10"]
    assert f"sampling from the 10 likeliest tokens {ppo['top_k_10']:.3f}, above it" in text
    # the two the line names although their means are inside the range: below their own
    # seed's default in every seed, as it says
    assert "inside that range, but below their own seed's default in every seed" in text
    for k in ("critic_from_zero", "dropout"):
        assert all(runs[f"{k}/{seed}"]["gold"] < runs[f"baseline/{seed}"]["gold"] for seed in range(3))
    rest = len(ppo) - 5  # the five the line names
    words = {10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen"}
    assert f"the other {words[rest]} stay within the default's seed range" in text


def test_the_readme_stays_short():
    """A newcomer reads the README in one sitting: detail and history belong in docs/."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = len(f.read().splitlines())
    assert lines < 300, f"README.md has {lines} lines; move detail into docs/ to stay under 300"


def test_the_readmes_refinements_line_is_bench_refinements_json():
    import json
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    with open(os.path.join(ROOT, "bench", "results", "refinements.json")) as f:
        s = json.load(f)["summary"]
    assert (f"lifts sort accuracy from {s['sort/grpo']['gold']['mean']:.3f} to "
            f"{s['sort/dynamic']['gold']['mean']:.3f}") in text
    loss = s["reviews_rm/grpo"]["gold"]["mean"] - s["reviews_rm/gspo"]["gold"]["mean"]
    assert f"loses {loss:.3f} gold on the reviews task's reward model" in text


def test_the_readmes_overoptimization_line_is_bench_overoptimization_json():
    """The README's KL ratio of the default PPO run to best-of-n is the bench's, per seed."""
    import json
    from conftest import bench_module
    bench = bench_module("overoptimization")
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    with open(bench.RESULTS) as f:
        result = json.load(f)
    rows = bench.ppo_against_best_of_n(result).splitlines()[2:]
    ratios = [float(row.split(" | ")[-1].rstrip("x |")) for row in rows]
    assert len(ratios) == 3
    assert f"the default PPO run spends {min(ratios):.1f}-{max(ratios):.1f}x the KL" in text


@pytest.mark.parametrize("page", [p for p in PAGES if "peers" not in p],  # peers: trl's names
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_every_function_and_test_a_page_names_exists(page):
    """`ppo.value_loss`, `heads.Critic.load_trunk_and_head`, `test_ppo.py::test_...`: a reader
    who looks one up finds it."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    missing = []
    for m in re.finditer(r"`([a-z_]+)\.([A-Za-z_]+)(?:\.([A-Za-z_]+))?`", text):
        module, name, attr = m.groups()
        if name in ("py", "jsonl", "js", "css", "json", "safetensors", "md") or \
                not os.path.exists(os.path.join(ROOT, "mingpt_rlhf", f"{module}.py")):
            continue
        found = getattr(importlib.import_module(f"mingpt_rlhf.{module}"), name, None)
        if found is None or (attr and getattr(found, attr, None) is None):
            missing.append(m.group(0))
    for m in re.finditer(r"`(test_\w+)\.py::(test_\w+)`", text):
        path = os.path.join(ROOT, "tests", f"{m.group(1)}.py")
        if not os.path.exists(path) or f"def {m.group(2)}(" not in page_text("tests", f"{m.group(1)}.py"):
            missing.append(m.group(0))
    assert not missing, f"{os.path.relpath(page, ROOT)} names what does not exist: {missing}"


# ----------------------------------------------------------------------------- figures quoted twice
def page_text(*path: str) -> str:
    """A file of the repository with its whitespace runs made single spaces (lines rewrap)."""
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return " ".join(f.read().split())


def bench_json(name: str) -> dict:
    import json
    with open(os.path.join(ROOT, "bench", "results", name)) as f:
        return json.load(f)


def near(quoted: str, value: float) -> bool:
    """`quoted` is `value` rounded to the digits it shows (either way at an exact half)."""
    digits = len(quoted.partition(".")[2])
    return abs(float(quoted) - value) <= 0.5 * 10 ** -digits + 1e-9


def test_the_method_tables_of_results_md_and_the_readme_agree_with_algorithms_json():
    """results.md's table of methods holds the JSON's figures, and each row the README repeats
    (gold +- standard error, KL) is written the same in both."""
    summary = bench_json("algorithms.json")["summary"]
    rows = {"PPO (`train_ppo.py`)": "ppo", "GRPO (`--algo grpo`)": "grpo",
            "RLOO (`--algo rloo`)": "rloo", "DPO (`train_dpo.py`)": "dpo",
            "best-of-16 (SFT policy)": "best_of_16", "best-of-4": "best_of_4",
            "best-of-1 (the SFT policy)": "best_of_1",
            "GRPO, the paper's std normalisation": "grpo_std_kl_reward",
            "GRPO, the paper's KL in the loss": "dr_grpo_kl_loss",
            "GRPO as published (both)": "grpo_std_kl_loss",
            "online DPO (`--algo online_dpo`": "online_dpo",
            "online DPO, `--dpo_beta 1`": "online_dpo_beta1",
            "online DPO, beta 1, best and worst of 4": "online_dpo_beta1_g4",
            "online DPO, beta 2": "online_dpo_beta2",  # the first row that starts so
            "online DPO, beta 2, best and worst of 4": "online_dpo_beta2_g4",
            "online DPO, beta 0.3, one pass": "online_dpo_e1",
            "online DPO, beta 1, one pass": "online_dpo_beta1_e1"}
    readme_rows = {"ppo": "| [PPO]", "grpo": "| [GRPO]", "rloo": "| [RLOO]", "dpo": "| [DPO]",
                   "best_of_16": "| [best-of-16]", "best_of_1": "| [the SFT policy]",
                   "online_dpo": "| [online DPO]"}

    def cells_of(path, width):
        with open(path, encoding="utf-8") as f:
            return [[c.strip().strip("*") for c in line.strip("|").split(" | ")]
                    for line in f.read().splitlines()
                    if line.startswith("| ") and line.count(" | ") == width - 1]
    results = cells_of(os.path.join(ROOT, "docs", "results.md"), 8)
    readme = {tuple(c) for c in cells_of(os.path.join(ROOT, "README.md"), 4)}
    for label, key in rows.items():
        row = next(c for c in results if c[0].startswith(label))
        s = summary[key]
        gold, _, stderr = row[1].partition(" +- ")
        assert near(gold, s["gold"]) and near(stderr, s["gold_stderr"]), (label, row[1])
        kl = row[3].removeprefix("<= ")
        assert near(kl, s["kl"]), (label, row[3])
        if key in readme_rows:
            again = next(c for c in readme if ("| " + c[0]).startswith(readme_rows[key]))
            assert (again[1], again[2]) == (row[1], row[3]), (label, again, row)
    assert set(rows.values()) == set(summary)


def test_the_run_reports_size_is_report_cost_json_in_both_places():
    runs = bench_json("report_cost.json")["summary"]
    for algo in ("ppo", "grpo"):
        rollouts, report = f"{runs[algo]['rollouts_mb']:.2f} MB", f"{runs[algo]['report_mb']:.2f} MB"
        speed = page_text("docs", "speed.md")
        assert f"| {rollouts} | {report} |" in speed, (algo, rollouts, report)
    scripts = page_text("docs", "scripts.md")
    ppo, grpo = runs["ppo"], runs["grpo"]
    assert (f"the default PPO run's is {ppo['rollouts_mb']:.2f} MB and its report.html "
            f"{ppo['report_mb']:.2f} MB, GRPO's {grpo['rollouts_mb']:.2f} MB and "
            f"{grpo['report_mb']:.2f} MB") in scripts


def test_the_shared_critics_cost_is_both_measurements_in_one_place():
    """`critic_from_zero` of bench/details.py is `--critic shared`, as is
    ppo_critic_choice.json's run: details.md gives the verdict with both; speed.md quotes its
    own measurement and points there."""
    details = bench_json("details.json")["summary"]
    assert bench_module_details()["critic_from_zero"][1] == {"critic": "shared"}
    choice = bench_json("ppo_critic_choice.json")["summary"]
    shared, separate = choice["shared"]["gold"]["mean"], choice["separate"]["gold"]["mean"]
    cost = details["baseline"]["gold"]["mean"] - details["critic_from_zero"]["gold"]["mean"]
    text = page_text("docs", "details.md")
    assert f"**A critic started from zero (`--critic shared`) costs {cost:.2f}**" in text
    assert f"gold {shared:.3f} against {separate:.3f}, also below in every seed" in text
    assert f"({cost:.2f} or {separate - shared:.2f})" in text
    assert f"(means {shared:.3f} and {separate:.3f})" in page_text("docs", "speed.md")


def bench_module_details() -> dict:
    from conftest import bench_module
    return bench_module("details").DETAILS


def test_the_negative_kl_quoted_is_overoptimization_json():
    """troubleshooting.md, overoptimization.md and the bench's comment quote the most negative
    logged KL of the bench's runs and the iterations where KL read below 0."""
    negative = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("kl"), float) and "step" in node and node["kl"] < 0:
                negative.append((node["step"], node["kl"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(bench_json("overoptimization.json"))
    low, high = min(kl for _, kl in negative), max(kl for _, kl in negative)
    steps = sorted({step for step, _ in negative})
    assert steps == [2, 3], steps
    trouble = page_text("docs", "troubleshooting.md")
    assert f"between {low:.3f} and {high:.4f} nats at iterations 2 and 3" in trouble
    assert f"{-low:.3f} nats below at most, at iterations 2-3" in page_text("docs", "overoptimization.md")
    assert f"({low:.3f} to {high:.4f} at iterations 2-3" in page_text("bench", "overoptimization.py")


def test_a_demonstrations_length_is_quoted_alike_and_true():
    """methods.md and tokenizer.py give a demonstration's length in word tokens and in
    characters (EOS counted as one of each), measured on the built-in task's SFT data."""
    import statistics
    from mingpt_rlhf.tasks import get_task
    task = get_task("reviews")
    tok = task.tokenizer()
    texts = [f"{p} {r}" for p, r in task.sft_examples("train")]
    tokens = [len(tok.encode(t)) + 1 for t in texts]
    chars = [len(t) + 1 for t in texts]
    said = (f"is {min(tokens)}-{max(tokens)} tokens ({statistics.median(tokens):.0f} at the median) "
            f"instead of {min(chars)}-{max(chars)} characters ({statistics.median(chars):.0f})")
    assert said in page_text("docs", "methods.md"), said
    assert said in page_text("mingpt_rlhf", "tokenizer.py"), said


def test_the_reduction_help_says_what_auto_resolves_to():
    """--reduction's help (and scripts.md's row) name, for every --algo, what "auto" becomes in
    resolve_auto_options, the function the trainer applies."""
    import dataclasses
    import train_ppo
    from mingpt_rlhf.ppo_trainer import resolve_auto_options
    field = next(f for f in dataclasses.fields(train_ppo.Config) if f.name == "reduction")
    help_text = " ".join(field.metadata["help"].split())

    def auto(**kw):
        return resolve_auto_options(train_ppo.Config(**kw)).reduction
    for algo in ("ppo", "reinforce++", "rloo"):
        assert f"{algo}: {auto(algo=algo)}," in help_text, algo
    assert (f"grpo: {auto(algo='grpo', grpo_norm='dr')} (--grpo_norm dr, the default) or "
            f"{auto(algo='grpo', grpo_norm='grpo')} (--grpo_norm grpo)") in help_text
    assert f"with --ratio sequence always {auto(algo='grpo', ratio='sequence')}" in help_text
    row = next(line for line in page_text("docs", "scripts.md").split("| `--") if line.startswith("reduction`"))
    assert (f"auto: {auto(algo='ppo')} for ppo and reinforce++, {auto(algo='rloo')} for rloo and for "
            f"grpo with `--grpo_norm dr` (the default), {auto(algo='grpo', grpo_norm='grpo')} for "
            f"grpo with `--grpo_norm grpo`") in row


def test_the_two_kl_options_say_they_are_not_each_other():
    """--kl_target (the reward's KL to the SFT policy) and --target_kl (approx-KL within an
    update) differ by word order only: each one's help names the other."""
    import dataclasses
    import train_ppo
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(train_ppo.Config)}
    assert "Not --target_kl" in helps["kl_target"] and "Not --kl_target" in helps["target_kl"]
    assert "## Two KLs, with near-identical option names" in page_text("docs", "details.md")


def test_the_readmes_staleness_line_is_bench_staleness_json():
    """The README's stale-sample figures are the study's: PPO with tis within 0.025 of the same
    seed's lag-0 gold at every lag on both tasks; PPO clipping against the sampler, GRPO's every
    correction and online DPO at lag 8 on reviews."""
    import json
    from conftest import bench_module
    bench = bench_module("staleness")
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    with open(bench.RESULTS) as f:
        result = json.load(f)
    bench.summarise(result)
    s = result["summary"]
    tis = [v["gold_change"] for k, v in s.items() if "/ppo/" in k and k.endswith("/tis")]
    assert len(tis) == 6 and all(abs(c["mean"]) <= 0.025 for c in tis)
    assert "PPO with `--offpolicy tis` keeps its gold (within 0.025)" in text
    change = lambda row: -s[f"reviews_rm/{row}"]["gold_change"]["mean"]
    assert f"clipping against the old sampler loses {change('ppo/lag8/clip'):.2f} on reviews" in text
    grpo = [change(f"grpo/lag8/{c}") for c in bench.corrections("grpo", 8)]
    assert f"GRPO on a reward model loses {min(grpo):.2f}-{max(grpo):.2f} whatever the correction" in text
    assert f"online DPO {change('online_dpo/lag8/none'):.2f}." in text
