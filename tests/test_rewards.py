"""Rewards computed by code (rewards.py): the user's function on decoded text, the task's own
check, and every way a user's function can go wrong (exit 2, one line, checkpoint intact)."""
import math
import os

import numpy as np
import pytest
import torch

import train_ppo
from conftest import left_pad
from mingpt_rlhf.errors import UserError
from mingpt_rlhf.metrics import read_metrics
from mingpt_rlhf.rewards import TextReward, check_scores, load_function
from mingpt_rlhf.tokenizer import WordTokenizer
from test_bad_input import exits_2
from test_scripts import ROOT, ppo_cfg

EXAMPLE = os.path.join(ROOT, "examples", "reward_positive.py")


def test_the_function_sees_each_prompt_and_response_decoded_once_per_batch():
    tok = WordTokenizer(["the", "plot", "was", "dull", "superb", "."])
    prompts = [tok.encode("the plot was"), tok.encode("plot was")]  # left-padded below
    ids, mask = left_pad(prompts, tok.pad_id)
    responses = torch.tensor([[tok.encode("superb")[0], tok.eos_id, tok.pad_id],
                              [tok.encode("dull")[0], tok.encode(".")[0], tok.eos_id]])
    action_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    seqs, attn = torch.cat([ids, responses], 1), torch.cat([mask, action_mask], 1)
    calls = []

    def fn(p, r):
        calls.append((p, r))
        return [len(x) for x in r]
    scores = TextReward(fn, "fn", tok)(seqs, attn, action_mask.float())
    assert calls == [(["the plot was", "plot was"], ["superb <eos>", "dull . <eos>"])]
    assert scores.dtype == torch.float32 and scores.tolist() == [12.0, 12.0]


@pytest.mark.parametrize("scores,words", [
    ([1.0], ["1 scores for 2"]), ("0.5 0.5", ["str"]), (None, ["NoneType"]),
    ([1.0, float("nan")], ["score 1", "nan"]), ([float("inf"), 0.0], ["score 0", "inf"]),
    ([1.0, "1"], ["score 1", "str"]), ([True, 1.0], ["bool"]),
])
def test_what_a_function_returns_is_checked(scores, words):
    with pytest.raises(UserError) as e:
        check_scores(scores, 2, "reward function f on rollout batch 1")
    assert all(w in str(e.value) for w in words) and "rollout batch 1" in str(e.value)


def test_numbers_of_every_kind_are_taken():
    assert check_scores([1, 2.5], 2, "f") == [1.0, 2.5]
    assert check_scores(np.array([0.5, -1.0]), 2, "f") == [0.5, -1.0]
    assert check_scores(torch.tensor([0.25, 3.0]), 2, "f") == [0.25, 3.0]


@pytest.mark.parametrize("spec,words", [
    ("nothing.py:score", ["no file nothing.py"]), ("examples/reward_positive.py:nope", ["no 'nope'"]),
    ("examples/reward_positive.py:POSITIVE", ["set, not a function"]),
    ("no_such_module_x:score", ["cannot import no_such_module_x"]),
    ("examples/reward_positive.py:", ["name both"]),
])
def test_a_function_that_cannot_be_loaded_is_named(spec, words, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(UserError) as e:
        load_function(spec)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_module_function_loads():
    function, name = load_function("math:fsum")
    assert function is math.fsum and name == "math:fsum"


def test_the_readme_example_trains_grpo_without_a_reward_model(stages, tmp_path):
    """`--reward examples/reward_positive.py:score`, as the README writes it; no --rm_dir."""
    root = stages[0]
    summary = train_ppo.main(ppo_cfg(tmp_path, root / "sft", tmp_path / "no_rm", algo="grpo",
                                     group_size=4, reward=EXAMPLE + ":score"))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert summary["final"] and "reward" in summary and "rm_score" not in summary
    assert all("reward" in r for r in rows if "pg_loss" in r)


@pytest.mark.parametrize("critic", ["auto", "separate"])
def test_ppo_on_the_tasks_check_with_either_critic(stages, tmp_path, critic):
    """No reward model: the shared critic (auto's choice) or a separate one from the policy."""
    root = stages[0]
    summary = train_ppo.main(ppo_cfg(tmp_path, root / "sft", tmp_path / "no_rm", reward="task",
                                     critic=critic, max_iters=2))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert (ckpt["critic"] is None) == (critic == "auto") and ckpt["config"]["critic"] != "auto"
    # the training reward is the task's gold reward: both are logged and agree
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r.get("split") == "eval"]
    assert all(r["reward"] == pytest.approx(r["gold"], abs=1e-6) for r in rows)
    assert summary["final"]


def write_function(tmp_path, body):
    path = tmp_path / "user_reward.py"
    path.write_text("CALLS = [0]\n\ndef score(prompts, responses):\n    CALLS[0] += 1\n" + body)
    return f"{path}:score"


@pytest.mark.parametrize("body,words", [
    ("    raise KeyError('label')\n", ["raised KeyError", "label", "rollout batch 1"]),
    ("    return [0.0] * (len(responses) - 1)\n", ["scores for"]),
    ("    return 'good'\n", ["returned a str"]),
    ("    return [float('nan')] * len(responses)\n", ["nan", "finite"]),
    # fails on the 4th batch only, after the first checkpoint, which must stay intact
    ("    if CALLS[0] == 4:\n        raise ValueError('late')\n    return [0.0] * len(responses)\n",
     ["raised ValueError", "late", "rollout batch 4", "checkpoint is intact"]),
])
def test_a_failing_function_exits_2_with_one_line_and_the_checkpoint_intact(
        stages, tmp_path, capsys, body, words):
    root = stages[0]
    spec = write_function(tmp_path, body)
    out = tmp_path / "run"
    line = exits_2(capsys, "train_ppo", [
        "--sft_dir", str(root / "sft"), "--out_dir", str(out), "--reward", spec, "--algo", "grpo",
        "--group_size", "4", "--rollout_batch_size", "8", "--minibatch_size", "4",
        "--max_iters", "4", "--eval_interval", "1", "--eval_prompts", "4", "--max_new_tokens", "8"])
    assert all(w in line for w in words), line
    if "late" in body:  # batches: 1 the step-0 eval, 2 iteration 1, 3 its eval, then the
        # checkpoint of step 1; 4 iteration 2, which fails
        ckpt = torch.load(out / "ckpt.pt", weights_only=False)
        assert ckpt["step"] == 1 and ckpt["stage"] == "grpo"


@pytest.mark.parametrize("argv,words", [
    (["--reward", "model"], ["--reward must be"]),
    (["--reward", "task", "--prompts", "p.jsonl"], ["--reward task", "--prompts"]),
    (["--critic", "both"], ["--critic must be"]),
])
def test_reward_options_that_cannot_work_exit_2(stages, tmp_path, capsys, argv, words):
    line = exits_2(capsys, "train_ppo", ["--sft_dir", str(stages[0] / "sft"),
                                         "--out_dir", str(tmp_path), *argv])
    assert all(w in line for w in words), line


def test_the_actor_lr_defaults_to_the_reward_source():
    """-1 (auto): 5e-5 on a reward model or a user's function, 1e-4 on the task's own check
    (docs/rewards.md: at 5e-5 GRPO on the gold reward was still rising at the end); a rate
    given is kept."""
    for reward, lr in (("rm", 5e-5), ("task", 1e-4), ("examples/reward_positive.py:score", 5e-5)):
        cfg = train_ppo.Config(reward=reward)
        train_ppo.check_config(cfg)
        assert cfg.actor_lr == lr
    cfg = train_ppo.Config(reward="task", actor_lr=3e-5)
    train_ppo.check_config(cfg)
    assert cfg.actor_lr == 3e-5  # a value given is kept
