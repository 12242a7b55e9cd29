"""Recorded rollouts and the run report: the recorded numbers are the Experience's, a resumed
run records what an uninterrupted one does, the page holds the run files' numbers, bad input
is one line, and the page runs in a real browser (headless chromium) without an error."""
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

import train_ppo
from conftest import copy_run
from mingpt_rlhf.run import report
from mingpt_rlhf.run.metrics import read_metrics
from mingpt_rlhf.run.rollouts import RolloutRecorder, rounded, token_texts
from mingpt_rlhf.tokenizer import WordTokenizer
from test_scripts import killed_after_first_save, ppo_cfg
from test_wiring import build_trainer, ppo_config, random_prompts

# the tiny trainer's 8 ids, as words: <pad> <eos> <unk> and five words
TOKENIZER = WordTokenizer(["a", "b", "c", "d", "e"])


def recorded(folder) -> list[dict]:
    return read_metrics(os.path.join(folder, "rollouts.jsonl"), "rollouts file")


def near(recorded_values, tensor, n):
    """The recorded list equals the tensor's first n numbers rounded to 4 significant digits."""
    return recorded_values == [rounded(x) for x in tensor[:n].tolist()]


def embedded_data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, flags=re.S)
    return json.loads(found.group(1))


# ----------------------------------------------------------------------------- recording
@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_a_recorded_line_holds_the_experiences_numbers(tmp_path, critic):
    torch.manual_seed(0)
    trainer = build_trainer(ppo_config(algo="ppo"), critic=critic)
    ids, mask = random_prompts(6)
    exp, _ = trainer.make_experience(ids, mask, torch.Generator().manual_seed(0), for_update=False)
    recorder = RolloutRecorder(str(tmp_path), 4, TOKENIZER)
    recorder.record(trainer, 10, exp, first=2)  # this batch starts at the eval's 3rd response
    lines = recorded(tmp_path)
    assert [(r["step"], r["prompt_index"], r["member"]) for r in lines] == [(10, 2, 0), (10, 3, 0)]
    T = exp.prompt_len
    with torch.no_grad():
        _, entropy, _ = trainer.policy_and_values(exp.sequences, exp.attention_mask, T, "value",
                                                  with_values=False)
    for row, line in enumerate(lines):
        n = int(exp.attention_mask[row, T:].sum())  # single turns: the response up to its EOS
        assert line["ids"] == exp.sequences[row, T:T + n].tolist() and line["env"] == [0] * n
        assert "".join(line["tokens"]) == TOKENIZER.decode(line["ids"])
        assert line["resp_len"] == n == int(exp.action_mask[row].sum())
        for name, tensor in [("logprob", exp.logprobs), ("ref_logprob", exp.ref_logprobs),
                             ("value", exp.values), ("advantage", exp.advantages),
                             ("reward", exp.rewards), ("entropy", entropy)]:
            assert near(line[name], tensor[row], n), name
        assert line["score"] == rounded(exp.scores[row].item())
        assert line["kl"] == rounded((exp.logprobs[row] - exp.ref_logprobs[row]).sum().item())
        assert line["kl_coef"] == rounded(trainer.kl_ctl.value)
        # the weight in an update on the two recorded rows (ratio 1, KL in the reward): the
        # advantage x PPO's token mean, 2 rows / their tokens
        per_response = 2 / exp.action_mask[:2].sum()
        assert near(line["normaliser"], per_response * exp.action_mask[row], n)
        assert near(line["weight"], exp.advantages[row] * per_response, n)
        assert line["weight_kl"] == [0.0] * n


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_critic_free_records_a_group_per_prompt_with_its_advantages(tmp_path, algo):
    torch.manual_seed(0)
    trainer = build_trainer(ppo_config(algo=algo), critic=None)
    ids, mask = random_prompts(6)
    exp, _ = trainer.make_experience(ids, mask, torch.Generator().manual_seed(0), for_update=False)
    RolloutRecorder(str(tmp_path), 2, TOKENIZER).record(trainer, 0, exp)
    lines = recorded(tmp_path)
    k = trainer.cfg.group_size
    assert [(r["prompt_index"], r["member"]) for r in lines] == [(p, m) for p in range(2) for m in range(k)]
    for p in range(2):
        group = lines[p * k:(p + 1) * k]
        prompt = TOKENIZER.decode([t for t, m in zip(ids[p].tolist(), mask[p].tolist()) if m])
        assert all(r["prompt"] == prompt and r["value"] is None for r in group)
        # one reward and one advantage per response, on each of its tokens, centred in the group
        rewards = torch.tensor([r["reward"][0] for r in group])
        advantages = torch.tensor([r["advantage"][0] for r in group])
        assert all(len(set(r["reward"])) == 1 and len(set(r["advantage"])) == 1 for r in group)
        by_hand = rewards - rewards.mean() if algo == "grpo" else (rewards - rewards.mean()) * k / (k - 1)
        torch.testing.assert_close(advantages, by_hand, atol=2e-3, rtol=2e-3)


def test_a_recorded_group_is_scored_with_its_own_prompts_fields(tmp_path):
    """The prompts file's other fields ride with each prompt into the group sampled for the
    record: prompt p's k responses are scored with field p (rows [p0 x k, p1 x k, ...]), not
    with the fields tiled over the groups ([p0, p1, p2, p0, ...]). A reward that returns the
    field tells them apart: every recorded line's score is its own prompt's field."""
    def by_field(sequences, attention_mask, action_mask, bonus):
        return torch.tensor(bonus, dtype=torch.float)
    # no EOS: every response is complete, so no score is replaced by the missing-EOS penalty
    trainer = build_trainer(ppo_config(algo="grpo"), critic=None, reward=by_field, eos_id=None)
    ids, mask = random_prompts(6)
    bonus = [0.5, -1.5, 2.0, 1.0, 0.0, -0.5]
    exp, _ = trainer.make_experience(ids, mask, torch.Generator().manual_seed(0), for_update=False,
                                     fields={"bonus": bonus})
    RolloutRecorder(str(tmp_path), 3, TOKENIZER).record(trainer, 0, exp, fields={"bonus": bonus})
    lines = recorded(tmp_path)
    k = trainer.cfg.group_size
    assert [r["prompt_index"] for r in lines] == [p for p in range(3) for _ in range(k)]
    for r in lines:
        p = r["prompt_index"]
        prompt = TOKENIZER.decode([t for t, m in zip(ids[p].tolist(), mask[p].tolist()) if m])
        assert (r["prompt"], r["score"]) == (prompt, bonus[p]), (p, r["prompt"], r["score"])


class Bytes:
    """A byte-level tokenizer: one id per byte, so a character can span two tokens."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_texts_join_to_the_decoded_text():
    assert token_texts(TOKENIZER, [3, 4, 1]) == ["a", " b", " <eos>"]
    ids = Bytes().encode("né!")  # the é is two bytes: the token that completes it shows it
    assert token_texts(Bytes(), ids) == ["n", "", "é", "!"]
    assert "".join(token_texts(Bytes(), ids[:2])) == Bytes().decode(ids[:2])  # cut mid-character


@pytest.fixture(scope="module")
def grpo_episodes(guess_sft, tmp_path_factory):
    """A tiny GRPO run on the guessing game, recording 2 episodes' groups: its folder."""
    from test_episodes import env_cfg
    out = tmp_path_factory.mktemp("report") / "guess_grpo"
    train_ppo.main(env_cfg(out, guess_sft, algo="grpo", max_iters=2, record_rollouts=2))
    return out


def test_episodes_mark_the_environments_tokens(grpo_episodes):
    lines = recorded(grpo_episodes)
    assert len(lines) == 2 * 2 * 4  # 2 evals (steps 0 and 2) x 2 seeds x groups of 4
    assert [r["seed"] for r in lines[:8]] == [0] * 4 + [1] * 4
    for r in lines:
        assert any(r["env"]) and r["resp_len"] == r["env"].count(0)  # replies between the turns
        for name in ("logprob", "ref_logprob", "advantage", "reward", "entropy"):
            assert [x is None for x in r[name]] == [bool(e) for e in r["env"]], name
        assert set(r["check"]) == {"success", "off_middle"}  # the game's own figures


def test_recording_changes_nothing_the_run_learns(stages, ppo_run, tmp_path):
    root = stages[0]
    train_ppo.main(ppo_cfg(tmp_path, root / "sft", root / "rm", record_rollouts=0))
    assert not (tmp_path / "rollouts.jsonl").exists()
    a = torch.load(ppo_run[0] / "ckpt.pt", weights_only=False)["actor"]["state"]
    b = torch.load(tmp_path / "ckpt.pt", weights_only=False)["actor"]["state"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # 8 responses at each of the evals 0, 2, 4: the default count, bounded by the evals
    lines = recorded(ppo_run[0])
    assert [r["step"] for r in lines] == [0] * 8 + [2] * 8 + [4] * 8
    assert {r["prompt"] for r in lines if r["step"] == 0} == {r["prompt"] for r in lines if r["step"] == 4}


def test_resume_cuts_the_rollouts_to_the_checkpoint_and_records_as_the_uninterrupted_run(
        stages, ppo_run, tmp_path):
    root = stages[0]
    killed = tmp_path / "killed"
    killed_after_first_save(train_ppo, ppo_cfg(killed, root / "sft", root / "rm"))
    # the killed run got further than its checkpoint (step 2) and was cut mid-line
    with open(killed / "rollouts.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "prompt_index": 0, "tokens": ["stale"]}) + "\n")
        f.write('{"step": 4, "prompt_in')
    train_ppo.main(ppo_cfg(killed, root / "sft", root / "rm", resume=True))
    straight = (ppo_run[0] / "rollouts.jsonl").read_bytes()
    assert (killed / "rollouts.jsonl").read_bytes() == straight


# ----------------------------------------------------------------------------- the page
def test_the_page_holds_the_numbers_of_the_run_files(ppo_run, tmp_path):
    folder = copy_run(ppo_run[0], tmp_path / "ppo")
    path = report.write_report([str(folder)])
    assert path == str(folder / "report.html")
    html = (folder / "report.html").read_text()
    assert len(html.encode()) < 2_000_000 and html.count("</script>") == 2
    (run,) = embedded_data(html)["runs"]
    assert run["rows"] == read_metrics(str(folder / "metrics.jsonl"))
    assert run["rollouts"] == recorded(folder)
    assert run["options"] == torch.load(folder / "ckpt.pt", weights_only=False)["config"]
    rows = run["rows"]
    start, final = next(r for r in rows if r.get("split") == "eval"), rows[-1]
    counts = report.update_counts(rows)
    assert counts["iterations"] == sum(1 for r in rows if "minibatch_steps" in r and "split" not in r)
    assert {k: final[k] for k in ("early_stops", "idle_updates")} == \
        {k: counts[k] for k in ("early_stops", "idle_updates")}  # the summary's, from the same rows
    assert run["comparison"] == (report.comparison_lines(start, final, "ppo")
                                 + report.update_lines(counts))
    assert run["comparison"][1].startswith("  gold ") and run["missing"] == []
    assert "src=" not in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")


def test_updates_that_took_no_step_are_counted_and_warned():
    rows = [{"step": 1, "minibatch_steps": 16, "early_stop_kl": 0.0},
            {"step": 2, "minibatch_steps": 3, "early_stop_kl": 0.031},
            {"step": 3, "minibatch_steps": 0, "early_stop_kl": 0.05},
            {"step": 3, "split": "eval", "gold": 0.5},
            {"step": 4, "minibatch_steps": 0, "early_stop_kl": 0.0},    # e.g. nothing kept
            {"step": 4, "final": True, "minibatch_steps": 0}]
    counts = report.update_counts(rows)
    assert counts == {"iterations": 4, "early_stops": 2, "idle_updates": 2, "stuck": []}
    lines = report.update_lines(counts)
    assert lines[0] == "updates: 2 of 4 stopped early by --target_kl"
    assert lines[1].startswith("warning: 2 of 4 updates took no optimizer step")
    assert report.update_lines({"iterations": 4, "early_stops": 0, "idle_updates": 0}) == \
        ["updates: 0 of 4 stopped early by --target_kl"]


def test_stretches_of_a_stuck_run_are_counted_and_warned():
    """`stuck` is logged each iteration (run/watch.py); the closing lines count each
    stretch that reached STUCK_AFTER, from its first iteration."""
    S = report.STUCK_AFTER
    stuck = [0, 1, 2] + list(range(1, S + 3)) + [0] + list(range(1, S)) + [0] + list(range(1, S + 1))
    rows = [{"step": i + 1, "minibatch_steps": 4, "stuck": k} for i, k in enumerate(stuck)]
    counts = report.update_counts(rows)
    first = 4  # the fourth iteration starts the first stretch of S + 2
    second = 3 + S + 2 + 1 + S - 1 + 1 + 1
    assert counts["stuck"] == [[first, S + 2], [second, S]]
    assert report.update_lines(counts)[1] == (
        f"warning: the run was stuck (no reward signal, its reward below its SFT level) in "
        f"{2 * S + 2} of {len(stuck)} iterations, from iteration {first}, {second} (see stuck "
        f"in metrics.jsonl)")


def test_the_kl_legend_says_what_the_penalty_charges_for_the_runs_placement(ppo_run, tmp_path):
    """The summed log-ratio is the logged kl; the penalty charges it (k1) only with the KL in
    the reward by default. With --kl_in loss it charges the k3 estimate per token, in the loss;
    another --kl_estimator is named with its formula; a run of unknown options is told both
    defaults. A run's page carries its own sentence (the PPO run's KL is k1 in the reward),
    which run/report.js appends to the KL legend."""
    in_reward = report.kl_legend({"kl_in": "reward", "kl_estimator": "k1"})
    assert "beta x the k1 estimate of each token, this number itself, in the reward" in in_reward
    assert "k3" not in in_reward and report.kl_legend({"kl_in": "reward"}) == in_reward
    in_loss = report.kl_legend({"kl_in": "loss", "kl_estimator": "auto"})  # k3, the default
    assert "beta x the k3 estimate of each token, e^(-x) + x - 1" in in_loss
    assert "in the loss" in in_loss and "nothing in the reward" in in_loss
    k2 = report.kl_legend({"kl_in": "reward", "kl_estimator": "k2"})
    assert "k2 estimate of each token, x^2 / 2" in k2 and "in the reward" in k2
    for unknown in (None, {}, {"kl_in": "auto"}):
        both = report.kl_legend(unknown)
        assert "that sum in the reward" in both and "k3" in both and "unknown" in both
    folder = copy_run(ppo_run[0], tmp_path / "ppo")
    (run,) = embedded_data(open(report.write_report([str(folder)])).read())["runs"]
    assert run["options"]["kl_in"] == "reward" and run["kl_legend"] == in_reward
    # that the legend shows it: test_the_page_runs_in_chromium_without_an_error


def test_text_a_policy_wrote_cannot_break_out_of_the_page(ppo_run, tmp_path):
    folder = copy_run(ppo_run[0], tmp_path / "ppo")
    lines = recorded(folder)
    lines[0]["tokens"][0] = "</script><script>alert(1)</script><!--"
    lines[0]["prompt"] = "<b>&amp;"
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    html = (folder / report.write_report([str(folder)]).split("/")[-1]).read_text()
    assert html.count("</script>") == 2 and "<!--" not in html and "<b>" not in html
    assert embedded_data(html)["runs"][0]["rollouts"][0]["tokens"][0].startswith("</script>")


def exits_2_with(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        report.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err
    return err[0]


def test_bad_input_is_one_line_or_a_page_that_says_what_is_missing(stages, ppo_run, tmp_path, capsys):
    exits_2_with(capsys, [str(tmp_path / "nothing")], "no metrics at")
    exits_2_with(capsys, [str(stages[0] / "sft")], "the report shows RL runs")
    exits_2_with(capsys, [str(ppo_run[0]), "--out", str(tmp_path / "no" / "r.html")], "no folder")
    exits_2_with(capsys, [], "the following arguments are required")
    # a run from before rollouts were recorded, killed mid-line, and without its checkpoint
    old = copy_run(ppo_run[0], tmp_path / "old")
    os.remove(old / "rollouts.jsonl")
    os.remove(old / "ckpt.pt")
    with open(old / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "rm_sc')
    report.main([str(old)])
    out = capsys.readouterr()
    assert "wrote " in out.out and "half-written last line" in out.err
    run = embedded_data((old / "report.html").read_text())["runs"][0]
    assert run["rollouts"] is None and run["options"] is None
    assert [m.split(" ")[:3] for m in run["missing"]] == [
        ["the", "last", "line"], ["no", "recorded", "rollouts"], ["no", "readable", "checkpoint"]]


# ----------------------------------------------------------------------------- a real browser
def chromium() -> str:
    """The path of Debian's chromium (or another Chromium-based browser), or a skip."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on this machine: `apt-get install chromium` (.ci/run installs it) "
                "to open the report in a real browser")


# run in the page after its own script: hover a token and a curve, pick another quantity, and
# leave what the page showed as attributes of <body>, which --dump-dom prints
PROBE = """<script>
(() => {  // its own scope: the page's names are globals
  const shown = () => document.getElementById("tip").textContent;
  const token = document.querySelector("#columns .tok:not(.env)");
  token.dispatchEvent(new MouseEvent("mousemove", {clientX: 20, clientY: 20, bubbles: true}));
  document.body.setAttribute("data-token-tip", shown());
  const svg = document.querySelector("#curves svg"), box = svg.getBoundingClientRect();
  svg.dispatchEvent(new MouseEvent("mousemove", {clientX: box.left + box.width / 2, clientY: box.top + 20}));
  document.body.setAttribute("data-curve-tip", shown());
  const pick = document.getElementById("pick-quantity");
  pick.value = "kl";
  pick.dispatchEvent(new Event("change"));
  document.body.setAttribute("data-kl-legend", document.getElementById("legend").textContent);
  pick.value = "entropy";
  pick.dispatchEvent(new Event("change"));
  document.body.setAttribute("data-legend", document.getElementById("legend").textContent.slice(0, 40));
})();
</script>"""


def browse(browser, page, *options) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *options, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def test_the_page_runs_in_chromium_without_an_error(ppo_run, grpo_episodes, tmp_path):
    """Opened from file://: the script builds the page (curves, token columns, the table of
    every response), logs nothing, and hovering and picking work; a screenshot is kept in the
    test's folder (MINGPT_RLHF_SCREENSHOT=path keeps it there instead). Two runs overlaid, one
    of them of episodes, so that the page's every part is drawn."""
    browser = chromium()
    page = tmp_path / "report.html"
    report.write_report([str(ppo_run[0]), str(grpo_episodes)], str(page))
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "\n</body>"))
    done = browse(browser, probed, "--dump-dom")
    dom = done.stdout
    assert done.returncode == 0 and 'data-ready="yes"' in dom, done.stderr[-2000:]
    assert '<div id="errors"></div>' in dom
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console  # the page logs nothing: no error, no warning
    assert dom.count('class="panel"') >= 8 and 'id="columns"' in dom and 'id="all-responses"' in dom
    assert 'class="tok"' in dom and "<path" in dom
    tips = {k: re.search(f'{k}="([^"]*)"', dom).group(1)
            for k in ("data-token-tip", "data-curve-tip", "data-legend", "data-kl-legend")}
    assert tips["data-token-tip"].startswith("token ") and "advantage" in tips["data-token-tip"]
    assert "at step" in tips["data-curve-tip"] and tips["data-legend"].startswith("0")
    assert "entropy" in tips["data-legend"]
    # the PPO run's KL is k1 in the reward: its KL legend says what that charges (report.kl_legend)
    assert "how much more likely" in tips["data-kl-legend"]
    assert "beta x the k1 estimate of each token, this number itself, in the reward" in tips["data-kl-legend"]
    shot = os.environ.get("MINGPT_RLHF_SCREENSHOT") or str(tmp_path / "report.png")
    done = browse(browser, page, "--window-size=1400,1500", f"--screenshot={shot}")
    assert done.returncode == 0 and open(shot, "rb").read(8) == b"\x89PNG\r\n\x1a\n", done.stderr[-2000:]


def test_a_resumed_run_that_no_longer_records_still_cuts_the_killed_runs_lines(tmp_path):
    """Resumed with --record_rollouts 0, the lines the killed run wrote past the checkpoint
    would otherwise stay and show in the report as if this run had made them."""
    from mingpt_rlhf.run.rollouts import RolloutRecorder
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"step": s, "tokens": []}) + "\n" for s in (0, 20, 40)))
    RolloutRecorder(str(tmp_path), 0, tokenizer=None, resume_step=20)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 20]
    RolloutRecorder(str(tmp_path), 0, tokenizer=None)  # a new run, not recording: no stale file
    assert not path.exists()
