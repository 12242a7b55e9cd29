"""sample.py on checkpoints trained for a few steps here: one prompt, a prompts file, piped
stdin, --compare with scores, and the mistakes a user makes (exit 2, one line; run in this
process through cli.run, as `python sample.py` does: tests/test_scripts.py runs sample.py as a
program once)."""
import io
import json

import pytest

import sample
from conftest import copy_run, exits_2


@pytest.fixture(scope="module")
def runs(tmp_path_factory, stages, ppo_run):
    """The shared tiny SFT and RM and the shared PPO run trained from them (copies), side by
    side in one folder."""
    root = tmp_path_factory.mktemp("sample")
    for name, folder in (("sft", stages[0] / "sft"), ("rm", stages[0] / "rm"), ("ppo", ppo_run[0])):
        copy_run(folder, root / name)
    return root


def cfg(root, **kw):
    return sample.Config(**{"ckpt_dir": str(root / "ppo"), "max_new_tokens": 8, **kw})


def test_one_prompt_gives_num_samples_answers_with_gold(runs):
    out = io.StringIO()
    rows = sample.main(cfg(runs, prompt="the plot was", num_samples=3), out=out)
    assert len(rows) == 3 and all(r["prompt"] == "the plot was" for r in rows)
    answers = [r[str(runs / "ppo")] for r in rows]
    assert all(-1 <= a["gold"] <= 1 and a["response"] in out.getvalue() for a in answers)


def test_same_seed_same_answers_and_another_seed_differs(runs):
    a = sample.main(cfg(runs, prompt="the cast felt", num_samples=4), out=io.StringIO())
    b = sample.main(cfg(runs, prompt="the cast felt", num_samples=4), out=io.StringIO())
    c = sample.main(cfg(runs, prompt="the cast felt", num_samples=4, seed=7), out=io.StringIO())
    key = str(runs / "ppo")
    texts = lambda rows: [r[key]["response"] for r in rows]  # noqa: E731
    assert texts(a) == texts(b) and texts(a) != texts(c)


def test_prompts_file_answers_every_prompt_in_order(runs, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["the plot was", "the music felt"]))
    rows = sample.main(cfg(runs, prompts=str(path), num_samples=2), out=io.StringIO())
    assert [r["prompt"] for r in rows] == ["the plot was"] * 2 + ["the music felt"] * 2


def test_piped_stdin_answers_each_line_until_an_empty_one(runs):
    stdin = io.StringIO("the plot was\nthe ending seemed\n\nnever read\n")
    rows = sample.main(cfg(runs), stdin=stdin, out=io.StringIO())
    assert [r["prompt"] for r in rows] == ["the plot was", "the ending seemed"]


def test_compare_prints_both_policies_with_rm_scores(runs):
    out = io.StringIO()
    rows = sample.main(cfg(runs, prompt="the plot was", compare=str(runs / "sft"),
                           rm_dir=str(runs / "rm")), out=out)
    row = rows[0]
    for name in (str(runs / "ppo"), str(runs / "sft")):
        assert "rm_score" in row[name] and "gold" in row[name] and f"{name}: " in out.getvalue()


@pytest.mark.parametrize("extra,needle", [
    (["--ckpt_dir", "RM"], "reward model, not a policy"),
    (["--ckpt_dir", "MISSING"], "no checkpoint"),
    (["--rm_dir", "SFT"], "not a reward model"),
    (["--prompts", "BAD"], "not UTF-8"),
    (["--prompts", "EMPTY"], "has no examples"),
    (["--temperature", "0"], "--temperature"),
    (["--top_p", "1.5"], "--top_p"),
    (["--num_samples", "x"], "num_samples"),
])
def test_user_mistakes_exit_2_with_one_line(runs, tmp_path, capsys, extra, needle):
    (tmp_path / "bad.jsonl").write_bytes(b'{"prompt": "\xff\xfe"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    names = {"RM": runs / "rm", "SFT": runs / "sft", "MISSING": tmp_path / "nothing",
             "BAD": tmp_path / "bad.jsonl", "EMPTY": tmp_path / "empty.jsonl"}
    args = [str(names.get(a, a)) for a in extra]
    base = ["--ckpt_dir", str(runs / "ppo"), "--prompt", "the plot was"]
    if "--prompts" in extra:
        base = base[:2]
    line = exits_2(capsys, "sample", [*base, *args])
    assert needle in line, line
