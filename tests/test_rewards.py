"""Rewards computed by code (rewards.py): the user's function on decoded text, the task's own
check, and every way a user's function can go wrong (exit 2, one line, checkpoint intact)."""
import json
import math
import os

import numpy as np
import pytest
import torch

import train_ppo
from conftest import left_pad
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.run.metrics import read_metrics
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
    """Any real number type, and any array or tensor holding exactly one number per response."""
    assert check_scores([1, 2.5], 2, "f") == [1.0, 2.5]
    assert check_scores(np.array([0.5, -1.0]), 2, "f") == [0.5, -1.0]
    assert check_scores(torch.tensor([0.25, 3.0]), 2, "f") == [0.25, 3.0]
    assert check_scores([np.float32(0.5), np.float64(2.0)], 2, "f") == [0.5, 2.0]
    assert check_scores([np.int64(3), np.int32(-1)], 2, "f") == [3.0, -1.0]
    assert check_scores([torch.tensor(0.25), torch.tensor(1)], 2, "f") == [0.25, 1.0]
    assert check_scores(np.array([[0.5], [1.5]]), 2, "f") == [0.5, 1.5]       # (B, 1) numpy
    assert check_scores(torch.tensor([[0.5], [1.5]]), 2, "f") == [0.5, 1.5]   # (B, 1) tensor


@pytest.mark.parametrize("scores,words", [
    ([1e39, 0.0], ["score 0", "inf in float32"]),      # finite in Python, inf in the run's float32
    ([np.bool_(True), 1.0], ["bool"]), (torch.tensor([True, False]), ["bool"]),
    (np.zeros((2, 2)), ["4 scores for 2"]), ([torch.tensor([1.0, 2.0]), 0.0], ["Tensor"]),
])
def test_numbers_the_run_cannot_use_are_refused(scores, words):
    with pytest.raises(UserError) as e:
        check_scores(scores, 2, "reward function f on rollout batch 1")
    assert all(w in str(e.value) for w in words), str(e.value)


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
    # fails on the 4th call only (the step-0 eval, iteration 1, its eval, then iteration 2;
    # no recorded rollouts, whose groups would call it too), after the first checkpoint, which
    # must stay intact; the error names the iteration
    ("    if CALLS[0] == 4:\n        raise ValueError('late')\n    return [0.0] * len(responses)\n",
     ["raised ValueError", "late", "rollout batch 1 of iteration 2", "checkpoint is intact"]),
])
def test_a_failing_function_exits_2_with_one_line_and_the_checkpoint_intact(
        stages, tmp_path, capsys, body, words):
    root = stages[0]
    spec = write_function(tmp_path, body)
    out = tmp_path / "run"
    line = exits_2(capsys, "train_ppo", [
        "--sft_dir", str(root / "sft"), "--out_dir", str(out), "--reward", spec, "--algo", "grpo",
        "--group_size", "4", "--rollout_batch_size", "8", "--minibatch_size", "4",
        "--max_iters", "4", "--eval_interval", "1", "--eval_prompts", "4", "--max_new_tokens", "8",
        "--record_rollouts", "0"])
    assert all(w in line for w in words), line
    if "late" in body:  # the checkpoint of step 1 was written before iteration 2 failed
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


def rollout_batch(tok, prompts, responses):
    """(sequences, attention_mask, action_mask) of word prompts and responses (EOS added)."""
    ids, mask = left_pad([tok.encode(p) for p in prompts], tok.pad_id)
    resp = [tok.encode(r) + [tok.eos_id] for r in responses]
    width = max(len(r) for r in resp)
    action = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in resp])
    resp = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in resp])
    return torch.cat([ids, resp], 1), torch.cat([mask, action], 1), action.float()


def test_the_prompts_files_fields_reach_the_function_by_name():
    """A function names the fields it wants and gets one value per response, in order; one that
    names none gets none; one with **kwargs gets them all."""
    tok = WordTokenizer(["1", "2", "3", "+", "="])
    batch = rollout_batch(tok, ["1 + 2 =", "2 + 1 ="], ["3", "2"])
    fields = {"answer": ["3", "3"], "level": [1, 2]}

    def exact(prompts, responses, answer):
        return [float(r == a + " <eos>") for r, a in zip(responses, answer)]
    assert TextReward(exact, "exact", tok)(*batch, **fields).tolist() == [1.0, 0.0]
    seen = {}

    def everything(prompts, responses, **kw):
        seen.update(kw)
        return [0.0] * len(responses)
    TextReward(everything, "all", tok)(*batch, **fields)
    assert seen == fields
    TextReward(lambda p, r: [0.0] * len(r), "none", tok)(*batch, **fields)  # takes no fields


def test_the_function_runs_outside_the_policys_autocast():
    """The trainer calls the reward outside its mixed precision: a user's torch scorer computes
    in float32, not in the policy's bfloat16."""
    from test_ppo_trainer import Cfg, make_trainer, prompts
    tok = WordTokenizer([str(i) for i in range(6)])
    dtypes = []

    def scorer(p, r):
        dtypes.append((torch.ones(2, 2) @ torch.ones(2, 2)).dtype)
        return [0.0] * len(r)
    tr = make_trainer(Cfg())
    tr.reward_fn = TextReward(scorer, "scorer", tok)
    tr.amp = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    tr.make_experience(*prompts(4), torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the check itself can fail
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert dtypes == [torch.float32]


def test_reward_clip_bounds_a_reward_models_scores_only():
    """--reward_clip clips the (normalised) reward model's scores; a function's scores are
    used as returned, whatever their scale; 0 turns the clip off."""
    from test_ppo_trainer import Cfg, make_trainer, prompts
    tok = WordTokenizer([str(i) for i in range(6)])
    hundred = TextReward(lambda p, r: [100.0] * len(r), "hundred", tok)
    for reward_fn, clip, expected in [(hundred, 5.0, 100.0),
                                      (lambda s, a, m, **f: torch.full((len(s),), 100.0), 5.0, 5.0),
                                      (lambda s, a, m, **f: torch.full((len(s),), 100.0), 0.0, 100.0)]:
        tr = make_trainer(Cfg(reward_clip=clip, missing_eos_penalty=expected))  # unended too
        tr.reward_fn = reward_fn
        exp, _ = tr.make_experience(*prompts(4), torch.Generator().manual_seed(0))
        assert exp.scores.tolist() == [expected] * 4, (clip, exp.scores)


def test_a_trainer_built_with_the_configs_autos_trains(tmp_path):
    """Config() as a benchmark builds it (actor_lr -1, ptx_coef -1, kl_in and reduction auto):
    PPOTrainer resolves them, so the optimizer's rate is 5e-5, not -1, and an iteration stays
    finite."""
    import copy
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.ppo import FixedKLController
    from mingpt_rlhf.ppo_trainer import PPOTrainer
    from test_ppo_trainer import count_target, prompts
    torch.manual_seed(0)
    actor = GPT(GPTConfig(vocab_size=8, block_size=24, n_layer=1, n_head=2, n_embd=32))
    ref = copy.deepcopy(actor).requires_grad_(False)
    head = torch.nn.Linear(32, 1)
    cfg = train_ppo.Config(rollout_batch_size=16, minibatch_size=8, max_new_tokens=8)
    tr = PPOTrainer(cfg, actor, ref, count_target, value_head=head, eos_id=1, pad_id=0,
                    kl_ctl=FixedKLController(0.05))
    assert tr.cfg.actor_lr == 5e-5 and tr.cfg.ptx_coef == 0.02 and tr.spec.kl_in == "reward"
    assert tr.actor_opt.adamw.param_groups[0]["lr"] == 5e-5
    before = [p.detach().clone() for p in actor.parameters()]
    _, stats = tr.step([prompts(16)], torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    assert all(math.isfinite(v) for v in stats.values())
    assert all(torch.isfinite(p).all() for p in actor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.parameters()))
    with pytest.raises(ValueError, match="actor_lr"):  # a sentinel that reaches it unresolved
        PPOTrainer(train_ppo.Config(actor_lr=-2.0), actor, ref, count_target, value_head=head)


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_fields_follow_their_prompt_through_grpo_groups_and_the_eval(stages, tmp_path):
    """Each row's extra fields reach the function beside the response to *that* prompt: in
    GRPO's groups (a prompt repeated group_size times), in the eval on the held-out rows, and
    a function that raises on any mismatch lets the run end."""
    from mingpt_rlhf.tasks import get_task
    prompts = get_task("reviews").prompts("train")[:24]
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": p, "same": p, "n": i}
                                                for i, p in enumerate(prompts)])
    fn = tmp_path / "check_fields.py"
    fn.write_text("SEEN = []\n\ndef score(prompts, responses, same, n):\n"
                  "    assert len(same) == len(n) == len(prompts)\n"
                  "    for p, s in zip(prompts, same):\n"
                  "        if p != s:\n            raise ValueError(f'{p!r} got the field of {s!r}')\n"
                  "    SEEN.extend(n)\n    return [float(len(r.split())) for r in responses]\n")
    summary = train_ppo.main(ppo_cfg(tmp_path / "run", stages[0] / "sft", tmp_path / "no_rm",
                                     algo="grpo", group_size=4, prompts=path, reward=f"{fn}:score"))
    assert summary["final"] and summary["reward"] > 1


@pytest.mark.parametrize("rows,words", [
    ([{"prompt": "the plot was", "answer": "a"}, {"prompt": "the cast felt"}],
     ["p.jsonl:2", "differ from line 1"]),
    ([{"prompt": "the plot was", "responses": "a"}], ["p.jsonl:1", "'responses'"]),
])
def test_prompts_with_unusable_fields_exit_2(stages, tmp_path, capsys, rows, words):
    path = write_prompts(tmp_path / "p.jsonl", rows)
    line = exits_2(capsys, "train_ppo", ["--sft_dir", str(stages[0] / "sft"), "--out_dir",
                                         str(tmp_path / "run"), "--prompts", path, "--reward",
                                         EXAMPLE + ":score"])
    assert all(w in line for w in words), line


@pytest.mark.parametrize("option,first,second", [("--reward", "task", "rm"),
                                                  ("--critic", "shared", "separate")])
def test_resume_with_another_reward_or_critic_names_the_runs_value(stages, tmp_path, capsys,
                                                                   option, first, second):
    """A resumed run builds the models the first run built: a changed --reward or --critic is
    one line naming the value the run was started with (it used to crash in the loading)."""
    root = stages[0]
    small = dict(max_iters=1, rollout_batch_size=8, minibatch_size=4, eval_prompts=4,
                 max_new_tokens=8)
    train_ppo.main(train_ppo.Config(sft_dir=str(root / "sft"), rm_dir=str(root / "rm"),
                                    out_dir=str(tmp_path), **small, **{option[2:]: first}))
    argv = [f"--{k}={v}" for k, v in {**small, "max_iters": 2}.items()]
    line = exits_2(capsys, "train_ppo", argv + ["--sft_dir", str(root / "sft"), "--rm_dir",
                                                str(root / "rm"), "--out_dir", str(tmp_path),
                                                "--resume", option, second])
    assert f"started with {option} {first}" in line and "resume with" in line, line


ARITHMETIC = os.path.join(ROOT, "examples", "arithmetic")


def test_the_arithmetic_examples_check_reads_the_answer_field():
    from mingpt_rlhf.rewards import load_function
    exact, _ = load_function(os.path.join(ARITHMETIC, "reward.py") + ":exact")
    assert exact(["3 4 + 1 7 =", "3 4 + 1 7 =", "1 + 1 ="], ["5 1 <eos>", "5 1 5 1 <eos>", "2"],
                 answer=["5 1", "5 1", "2"]) == [1.0, 0.0, 0.0]


def test_the_arithmetic_example_trains_sft_then_grpo_on_its_answers(tmp_path):
    """docs/rewards.md's commands at tiny size: SFT on the example's demonstrations, then GRPO
    whose function reads each prompt's "answer"; the eval's reward is exact-match accuracy on
    the held-out file, a share of 0/1 scores."""
    import train_sft
    from test_scripts import sft_cfg
    train_sft.main(sft_cfg(tmp_path / "sft", data=os.path.join(ARITHMETIC, "demos.jsonl"),
                           eval_data=os.path.join(ARITHMETIC, "demos_eval.jsonl"), max_iters=10))
    summary = train_ppo.main(ppo_cfg(
        tmp_path / "grpo", tmp_path / "sft", tmp_path / "no_rm", algo="grpo", group_size=4,
        max_new_tokens=8, prompts=os.path.join(ARITHMETIC, "prompts.jsonl"),
        eval_prompts_file=os.path.join(ARITHMETIC, "eval.jsonl"),
        reward=os.path.join(ARITHMETIC, "reward.py") + ":exact"))
    evals = [r for r in read_metrics(tmp_path / "grpo" / "metrics.jsonl") if r.get("split") == "eval"]
    assert summary["final"] and all(round(r["reward"] * 16) == r["reward"] * 16 for r in evals)
