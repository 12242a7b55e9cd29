"""The README and docs/ stay true: every relative link resolves (to a file, and to a heading
when it names one), every pointer to a named section ("X" below, see "X") finds that heading
where it says, every `python ...` command they quote names a script that exists with options
its own parser accepts, and a figure quoted in two places is the same figure, its JSON's."""
import dataclasses
import glob
import importlib
import os
import re
import shlex

import pytest

from mingpt_rlhf.machinery.cli import build_parser
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
    if args[:2] in (["-m", "mingpt_rlhf.run.plot"], ["-m", "mingpt_rlhf.run.report"],
                    ["-m", "mingpt_rlhf.run.export"]):
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
    from mingpt_rlhf.machinery.errors import UserError
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
                + glob.glob(os.path.join(ROOT, "mingpt_rlhf", "**", "*.py"), recursive=True)
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


def test_the_details_summary_says_true_things_of_bench_details_json():
    """results.md's summary of which details matter (its figures carry source markers) says
    true things of bench/results/details.json: which means fall outside the default's seed
    range, and how many stay inside it."""
    text = without_markers(page_text("docs", "results.md"))
    result = bench_json("details.json")
    s, runs = result["summary"], result["runs"]
    base = s["baseline"]["gold"]
    assert all(v["seeds"] == 3 for k, v in s.items() if k in ("baseline", "no_kl", "dropout"))
    ppo = {k: v["gold"]["mean"] for k, v in s.items() if k != "baseline" and not k.startswith("sort")}
    assert sorted(k for k, g in ppo.items() if g < base["min"]) == ["no_kl", "rm_unnormalised"]
    assert [k for k, g in ppo.items() if g > base["max"]] == ["top_k_10"]
    assert "sampling from the 10 likeliest tokens 0.966, above it" in text  # (its value: a marker)
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
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/ to keep it to 200"


def test_the_refinements_summary_is_bench_refinements_json():
    """The two figures of results.md's refinements summary that no one value of the JSON holds:
    a ratio of generated tokens and a difference of gold."""
    text = without_markers(page_text("docs", "results.md"))
    s = bench_json("refinements.json")["summary"]
    tokens = s["sort/dynamic"]["gen_tokens"]["mean"] / s["sort/grpo"]["gen_tokens"]["mean"]
    assert f"for {tokens:.2f}x the generated tokens" in text
    loss = s["reviews_rm/grpo"]["gold"]["mean"] - s["reviews_rm/gspo"]["gold"]["mean"]
    assert f"loses {loss:.3f} gold on the reviews task's reward model" in text


def test_the_overoptimization_summary_is_bench_overoptimization_json():
    """results.md's KL ratio of the default PPO run to best-of-n is the bench's, per seed."""
    import json
    from conftest import bench_module
    bench = bench_module("overoptimization")
    text = page_text("docs", "results.md")
    with open(bench.RESULTS) as f:
        result = json.load(f)
    rows = bench.ppo_against_best_of_n(result).splitlines()[2:]
    ratios = [float(row.split(" | ")[-1].rstrip("x |")) for row in rows]
    assert len(ratios) == 3
    assert f"the default PPO run spends {min(ratios):.1f}-{max(ratios):.1f}x the KL" in text


# the package's modules by the name a page calls them (`hacking.HackingMonitor`), wherever
# they live: {"hacking": "mingpt_rlhf.lab.hacking", "ppo": "mingpt_rlhf.ppo", ...}
MODULES = {os.path.splitext(os.path.basename(p))[0]:
           os.path.splitext(os.path.relpath(p, ROOT))[0].replace(os.sep, ".")
           for p in glob.glob(os.path.join(ROOT, "mingpt_rlhf", "**", "*.py"), recursive=True)
           if not p.endswith("__init__.py")}


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
        if name in ("py", "jsonl", "js", "css", "json", "safetensors", "md") or module not in MODULES:
            continue
        found = getattr(importlib.import_module(MODULES[module]), name, None)
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


def without_markers(text: str) -> str:
    """A page as a reader reads it: the figures' source markers out, white space made single."""
    return " ".join(re.sub(r"<!--.*?-->", "", text, flags=re.S).split())


def bench_json(name: str) -> dict:
    import json
    with open(os.path.join(ROOT, "bench", "results", name)) as f:
        return json.load(f)


def near(quoted: str, value: float) -> bool:
    """`quoted` is `value` rounded to the digits it shows (either way at an exact half)."""
    digits = len(quoted.partition(".")[2])
    return abs(float(quoted) - value) <= 0.5 * 10 ** -digits + 1e-9


def test_the_method_table_of_results_md_is_algorithms_json():
    """results.md's table of methods holds the JSON's figures (gold +- standard error, KL) for
    every method the JSON holds (the README's rows carry source markers)."""
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

    def cells_of(path, width):
        with open(path, encoding="utf-8") as f:
            return [[c.strip().strip("*") for c in line.strip("|").split(" | ")]
                    for line in f.read().splitlines()
                    if line.startswith("| ") and line.count(" | ") == width - 1]
    results = cells_of(os.path.join(ROOT, "docs", "results.md"), 8)
    for label, key in rows.items():
        row = next(c for c in results if c[0].startswith(label))
        s = summary[key]
        gold, _, stderr = row[1].partition(" +- ")
        assert near(gold, s["gold"]) and near(stderr, s["gold_stderr"]), (label, row[1])
        kl = row[3].removeprefix("<= ")
        assert near(kl, s["kl"]), (label, row[3])
    assert set(rows.values()) == set(summary)


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


def test_the_staleness_bound_is_bench_staleness_json():
    """The bound on stale samples that the README and results.md give is the study's: PPO with
    tis within 0.025 of the same seed's lag-0 gold at every lag on both tasks (the line's other
    figures carry markers)."""
    import json
    from conftest import bench_module
    bench = bench_module("staleness")
    with open(bench.RESULTS) as f:
        result = json.load(f)
    stored = {k: v["gold_change"]["mean"] for k, v in result["summary"].items() if "gold_change" in v}
    bench.summarise(result)
    s = result["summary"]
    # the markers read the summary the JSON stores: it must be the one its runs give
    assert stored == pytest.approx({k: v["gold_change"]["mean"] for k, v in s.items()
                                    if "gold_change" in v})
    tis = [v["gold_change"] for k, v in s.items() if "/ppo/" in k and k.endswith("/tis")]
    assert len(tis) == 6 and all(abs(c["mean"]) <= 0.025 for c in tis)
    for page in (("README.md",), ("docs", "results.md")):
        assert "PPO with `--offpolicy tis` keeps its gold (within 0.025)" in page_text(*page), page
    # the pages' marker reads GRPO's loss over every lag-8 row: they must be the corrections
    assert sorted(k.split("/")[-1] for k in s if k.startswith("reviews_rm/grpo/lag8/")) == \
        sorted(bench.corrections("grpo", 8))


# ----------------------------------------------------------------------------- figures and sources
# THE RULE. A measured figure is stated once, where its study is written up, with the command
# and revision that made it; every other page links there, or quotes it with a source marker:
#
#     gold 0.952<!-- algorithms.json summary grpo gold -->
#     0.829-0.857<!-- kl_estimators.json summary reviews_rm/grpo/k3_in_loss gold: {min}-{max} -->
#
# an HTML comment (GitHub does not render it) naming bench/results/NAME.json, the path into it
# and, after a colon, the text it covers with `{...}` for each number (tests/doc_figures.py
# gives the whole syntax). Every marker of every page is checked: the quoted number must be
# the JSON's value rounded to the digits it shows. In README.md, the page that repeats figures
# from every study, every decimal of the prose (code blocks and inline code aside) must carry a
# marker or be held by a phrase of ALLOWED below, with its reason; a doc page opts a summary
# (the paragraph or list item that holds it) into the same rule with
# `<!-- every figure sourced -->`. The docs' own tables are printed by the benches (`--table`)
# and are not held to it.
import doc_figures  # noqa: E402

FIGURE_PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))

ALLOWED = {  # page: [(a phrase that holds decimals without a marker, why), ...]
    "README.md": [
        ("(about 5 minutes on 2 otherwise idle CPU cores", "the suite's time: docs/testing.md's runs, no bench JSON"),
        ("about 1.4 and 0.95 within 100", "a picture's description, read off the picture"),
        ("at KL 0.02 none did", "a setting of the study (the KL coefficient), not a measurement"),
        ("(within 0.025)", "a bound: test_the_staleness_bound_is_bench_staleness_json"),
        ("trl 1.16", "a version"),
    ],
    "docs/results.md": [  # its "Every study in brief"
        ("for 2.85x the generated tokens", "a ratio: test_the_refinements_summary_is_bench_refinements_json"),
        ("loses 0.137 gold", "a difference: test_the_refinements_summary_is_bench_refinements_json"),
        ("spends 1.2-1.7x the KL",
         "a ratio per seed: test_the_overoptimization_summary_is_bench_overoptimization_json"),
        ("at KL 0.02 none did", "a setting of the study (the KL coefficient), not a measurement"),
        ("(within 0.025)", "a bound: test_the_staleness_bound_is_bench_staleness_json"),
        ("trl 1.16", "a version"), ("trl 0.11.4", "a version"),
        ("Qwen3-0.6B's shape", "a model's name"),
    ],
    "docs/gradients.md": [
        ("its evals peaking at 3.6-4.8 nats", "the highest eval of each run's curve, not a stored figure"),
        ("peaked at 3.4-4.4", "the highest eval of each run's curve, not a stored figure"),
    ],
    "docs/rewards.md": [
        ("a standard error of about 0.02", "a 200-prompt eval's, estimated in docs/details.md"),
    ],
}


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_figure_that_names_its_source_is_its_sources_value(page):
    with open(page, encoding="utf-8") as f:
        problems, _ = doc_figures.sourced(f.read())
    assert not problems, f"{os.path.relpath(page, ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_no_figure_without_a_source_in_the_readme_and_the_sourced_summaries(page):
    """The README's decimals, and those of a doc's `<!-- every figure sourced -->` blocks, each
    carry a source marker or stand in a phrase of ALLOWED; an ALLOWED phrase the page no longer
    holds is an error too (the list stays short and true)."""
    name = os.path.relpath(page, ROOT)
    with open(page, encoding="utf-8") as f:
        text = f.read()
    _, spans = doc_figures.sourced(text)
    scope = None if name == "README.md" else doc_figures.sourced_blocks(text)
    if scope == [] and name not in ALLOWED:
        return
    missing, unused = doc_figures.unsourced(text, [p for p, _ in ALLOWED.get(name, [])], spans, scope)
    assert not missing, (f"{name}: figures without a source (add a marker, see tests/doc_figures.py, "
                         f"or a phrase with its reason to ALLOWED):\n" + "\n".join(missing))
    assert not unused, f"{name}: ALLOWED phrases the page no longer holds: {unused}"


def test_the_figure_checks_fail_on_a_wrong_figure_a_wrong_path_and_a_figure_without_a_source():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    right = "0.952 +- 0.005**<!-- algorithms.json summary grpo: {gold} +- {gold_stderr} -->"
    assert right in readme
    problems, _ = doc_figures.sourced(readme.replace(right, right.replace("0.952", "0.953")))
    assert len(problems) == 1 and "0.953 is not {gold} = 0.9523" in problems[0], problems
    page = ("GRPO ends at 0.952<!-- algorithms.json summary grpo gold --> (0.005<!-- algorithms.json "
            "summary grpo gold -->), 0.9<!-- algorithms.json summary nothing gold -->, "
            "96-97 %<!-- multiturn.json summary grpo success: {min*100}-{max*100} -->; PPO 0.94 and 1.5x.")
    problems, spans = doc_figures.sourced(page)
    assert len(problems) == 3, problems
    assert "0.005 is not {} = 0.9523" in problems[0]  # a figure that is not its source's
    assert "no 'summary nothing gold' in bench/results/algorithms.json" in problems[1]
    assert "the text before it does not read '{min*100}-{max*100}'" in problems[2]  # (the % is missing)
    missing, unused = doc_figures.unsourced(page, ["and 1.5x", "gone"], spans)
    assert [m.split(" (")[0] for m in missing] == ["line 1: 0.94"] and unused == ["gone"], missing
    summary = "Intro 1.5.\n\n- a 0.25 and 0.5<!-- every figure sourced -->\n- b 0.75\n"
    missing, _ = doc_figures.unsourced(summary, [], [], doc_figures.sourced_blocks(summary))
    assert [m.split(" (")[0] for m in missing] == ["line 3: 0.25", "line 3: 0.5"], missing


# ----------------------------------------------------------------------------- option values
SCRIPT_CONFIGS = {name: importlib.import_module(name).Config for name in SCRIPTS}
PLACEHOLDER_VALUE = re.compile(r"[A-Z][A-Z0-9_]*|[a-z]|\w*\.\.\.|\W+")  # --seed S, --ensemble K, --seed + i
# values written on purpose as mistakes: the pages that list what a user can get wrong
MISTAKES = {("docs/troubleshooting.md", "lr", "fast"), ("docs/troubleshooting.md", "batch_size", "2.5")}


def option_problem(name: str, value: str, scripts=SCRIPTS) -> str:
    """"" if one of `scripts` whose Config has `--name` takes `value` (its parser's type; for
    train_ppo.py also check_config's "--name must ..." checks, where the choices are), else
    why not. An option no script has (a bench's --seeds) is not ours to check: ""."""
    from mingpt_rlhf.machinery.errors import UserError
    owners = [s for s in scripts if name in {f.name for f in dataclasses.fields(SCRIPT_CONFIGS[s])}]
    if not owners or PLACEHOLDER_VALUE.fullmatch(value):
        return ""
    why = []
    for script in owners:
        try:
            args = build_parser(SCRIPT_CONFIGS[script]).parse_args([f"--{name}", value])
        except UserError as e:
            why.append(f"{script}.py: {e}")
            continue
        if script == "train_ppo":
            from mingpt_rlhf.run.rl_options import check_config
            try:
                check_config(SCRIPT_CONFIGS[script](**vars(args)))
            except UserError as e:
                if str(e).startswith(f"--{name} must"):
                    why.append(f"{script}.py: {e}")
                    continue
        return ""
    return "; ".join(why)


def written_options(text: str):
    """(line, name, value) of every option given a value in the page's inline code: `--name
    value`, `--name=value`, `python script.py --a 1 --b x`; a value written `a|b|c` is each of
    a, b, c. Code blocks are the commands' test's."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for m in re.finditer(r"`([^`\n]*--[^`\n]*)`", text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            words = shlex.split(m.group(1).replace("\\|", "|"))
        except ValueError:
            continue
        for i, word in enumerate(words):
            if not re.fullmatch(r"--\w+(=.*)?", word):
                continue
            name, eq, value = word[2:].partition("=")
            if not eq:
                if i + 1 >= len(words) or words[i + 1].startswith("--"):
                    continue
                value = words[i + 1]
            for one in value.split("|"):
                yield line, name, one


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_option_value_the_docs_write_is_one_the_scripts_accept(page):
    """`--ptx_coef 0`, `--algo grpo`, `--kl_in loss`: what a reader copies must run. Also a
    value written beside the option, "`--ptx_coef` auto": the scripts' "auto" is -1 for a
    number."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    where = os.path.relpath(page, ROOT)
    problems = [f"line {line}: --{name} {value}: {why}" for line, name, value in written_options(text)
                if (where, name, value) not in MISTAKES and (why := option_problem(name, value))]
    for m in re.finditer(r"`--(\w+)`,? (?:default )?(auto)\b", prose(text)):
        if why := option_problem(m.group(1), m.group(2)):
            problems.append(f"line {text.count(chr(10), 0, m.start()) + 1}: `--{m.group(1)}` auto: {why}")
    assert not problems, f"{where}:\n" + "\n".join(problems)


def test_the_option_check_catches_a_wrong_type_a_wrong_choice_and_auto_for_a_number():
    assert "invalid float value: 'auto'" in option_problem("ptx_coef", "auto")
    assert "--algo must be" in option_problem("algo", "ppo2")
    assert "--sampler_lag must be" in option_problem("sampler_lag", "9")
    assert option_problem("group_size", "4") == option_problem("lr", "3e-4") == ""
    assert option_problem("seeds", "0") == ""  # a bench's option, not a script's
    assert [x[1:] for x in written_options("run `--kl_in loss` or `--reward rm\\|task` and "
                                           "`python train_ppo.py --actor_lr=1e-4 --resume`")] == \
        [("kl_in", "loss"), ("reward", "rm"), ("reward", "task"), ("actor_lr", "1e-4")]


def scripts_md_defaults():
    """(script, option, the default scripts.md's table gives, line) for every row of the
    option tables under each script's heading: `| --a, --b | 1, x | ... |`, one value per
    option (or one for all), "none" for an empty default, "-1 (auto: ...)" kept to its -1."""
    with open(os.path.join(ROOT, "docs", "scripts.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    script = None
    for i, line in enumerate(lines):
        heading = re.match(r"## `(\w+)\.py`", line)
        if heading:
            script = heading.group(1)
        elif line.startswith("## "):
            script = None
        if script not in SCRIPTS or not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        names = re.findall(r"--(\w+)", cells[0])
        values, depth, word = [], 0, ""  # split the defaults on ", " outside brackets and code
        for ch in cells[1] + ",":
            depth += ch in "([" and 1 or ch in ")]" and -1 or 0
            if ch == "`":
                depth += -1 if word.count("`") % 2 else 1
            if ch == "," and depth == 0:
                values.append(word.strip())
                word = ""
            else:
                word += ch
        values = [v.split(" (")[0].strip("` ") for v in values] if " / " not in cells[1] else \
            [v.split(" (")[0].strip("` ") for v in cells[1].split(" / ")]
        if len(values) == 1:
            values = values * len(names)
        assert len(values) == len(names), f"docs/scripts.md line {i + 1}: {names} against {values}"
        yield from ((script, n, v, i + 1) for n, v in zip(names, values))


def test_the_defaults_scripts_md_gives_are_the_configs():
    """Each default in docs/scripts.md's option tables is the script's Config default, written
    as `--help` prints it ("none" for an empty one)."""
    found, wrong = list(scripts_md_defaults()), []
    for script, name, value, line in found:
        config = SCRIPT_CONFIGS[script]
        field = next((f for f in dataclasses.fields(config) if f.name == name), None)
        if field is None:
            wrong.append(f"line {line}: {script}.py has no --{name}")
            continue
        parsed = "" if value == "none" and field.default == "" else \
            getattr(build_parser(config).parse_args([f"--{name}", value]), name)
        if parsed != field.default:
            wrong.append(f"line {line}: --{name} default {value!r}, the Config's is {field.default!r}")
    assert len(found) > 60 and not wrong, "\n".join(wrong)
