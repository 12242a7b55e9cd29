"""The scripts at tiny size: smoke runs, exact resume after a kill, exit status 2.

An uninterrupted run that several tests read is made once per session (tests/conftest.py:
`stages`, `ppo_run`, `rm_unnormalised`, `dpo_run`; a resume test kills and resumes its own
copy of the configuration and compares the end with the shared run). A user's mistake runs in
this process through `cli.run` (conftest.exits_2), as `python X.py` would; one test runs each
script as a real program.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import train_ppo
import train_rm
import train_sft
from conftest import as_options, copy_run, exits_2
from mingpt_rlhf.machinery import cli
from mingpt_rlhf.heads import Critic, RewardModel
from mingpt_rlhf.model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=48)


def sft_cfg(out_dir, **kw):
    base = dict(out_dir=str(out_dir), batch_size=16, max_iters=20, eval_interval=10,
                eval_prompts=16, warmup_iters=2, **TINY)
    return train_sft.Config(**{**base, **kw})


def rm_cfg(out_dir, sft_dir, **kw):
    base = dict(out_dir=str(out_dir), sft_dir=str(sft_dir), n_pairs=160, batch_size=16,
                eval_interval=5, norm_samples=32)
    return train_rm.Config(**{**base, **kw})


def ppo_cfg(out_dir, sft_dir, rm_dir, **kw):
    base = dict(out_dir=str(out_dir), sft_dir=str(sft_dir), rm_dir=str(rm_dir), max_iters=4,
                rollout_batch_size=16, minibatch_size=8, ppo_epochs=2, eval_interval=2,
                eval_prompts=16, max_new_tokens=24)
    return train_ppo.Config(**{**base, **kw})


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


class Killed(Exception):
    pass


def kill_after_first_save(monkeypatch, module):
    """Make the script die right after it writes its first checkpoint, as a killed run would."""
    real = module.save_checkpoint

    def save_then_die(path, state):
        real(path, state)
        raise Killed()
    monkeypatch.setattr(module, "save_checkpoint", save_then_die)


def killed_after_first_save(module, cfg):
    """Run `module.main(cfg)` until it has written its first checkpoint, killed there."""
    with pytest.MonkeyPatch.context() as m:
        kill_after_first_save(m, module)
        with pytest.raises(Killed):
            module.main(cfg)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_sft_smoke_writes_a_loadable_checkpoint_and_metrics(stages):
    root, summary, _ = stages
    ckpt = torch.load(root / "sft" / "ckpt.pt", weights_only=False)
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    lines = read_metrics(root / "sft")
    assert all("step" in e and "time" in e for e in lines)
    assert any(e.get("split") == "eval" for e in lines)
    assert lines[-1]["final"] and {"eval_loss", "well_formed", "gold"} <= set(lines[-1])
    assert summary == lines[-1]


def test_sft_resume_continues_exactly(stages, tmp_path):
    straight = stages[0] / "sft"  # sft_cfg's run, uninterrupted
    killed = tmp_path / "killed"
    killed_after_first_save(train_sft, sft_cfg(killed))
    assert torch.load(killed / "ckpt.pt", weights_only=False)["step"] == 10
    train_sft.main(sft_cfg(killed, resume=True))
    a = torch.load(straight / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(killed / "ckpt.pt", weights_only=False)["model"]
    assert_same_weights(a, b)
    steps = [e["step"] for e in read_metrics(killed) if "loss" in e]
    assert steps == sorted(set(steps))  # no step logged twice after the resume


def test_rm_checkpoint_loads_into_reward_model_and_critic(stages):
    root, _, summary = stages
    assert {"eval_acc", "eval_gold_acc", "eval_gold_corr", "norm_gain"} <= set(summary)
    ckpt = torch.load(root / "rm" / "ckpt.pt", weights_only=False)
    rm = RewardModel(GPTConfig(**ckpt["model_config"]))
    rm.load_state_dict(ckpt["model"])
    assert rm.gain.item() != 1.0  # normalisation was stored
    critic = Critic(GPTConfig(**ckpt["model_config"]))
    critic.load_trunk_and_head(ckpt["model"])
    ids = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]])
    mask = (torch.arange(5) < torch.tensor([[5], [4]])).long()
    with torch.no_grad():  # the critic speaks in the normalised units of PPO's rewards
        torch.testing.assert_close(critic(ids, mask)[[0, 1], [4, 3]], rm(ids, mask))
    assert ckpt["sft"]["step"] == 20


def test_rm_of_another_size_is_normalised_on_the_policys_samples(stages, tmp_path):
    """--norm_policy: a reward model trained from an SFT of another size than the policy gets
    mean 0 and std 1 on the policy's samples (those PPO will score), not on its own SFT's."""
    import train_rm
    import train_sft
    from mingpt_rlhf.stages import load_policy, load_reward_model
    from mingpt_rlhf.machinery.runtime import autocast
    from mingpt_rlhf.tasks import get_task
    root = stages[0]
    train_sft.main(sft_cfg(tmp_path / "sft_small", n_embd=16, max_iters=10))
    cfg = rm_cfg(tmp_path / "rm", tmp_path / "sft_small", norm_policy=str(root / "sft"))
    train_rm.main(cfg)
    rm = load_reward_model(str(tmp_path / "rm"))
    policy, tokenizer, _ = load_policy(str(root / "sft"))
    prompts = get_task("reviews", seed=cfg.seed).prompts("train")[:cfg.norm_samples]
    ctx = autocast(torch.device("cpu"), torch.float32)
    raw = train_rm.sft_sample_scores(policy, rm, tokenizer, prompts, cfg, ctx)
    normalised = rm.gain * raw + rm.bias
    assert abs(normalised.mean().item()) < 1e-4 and abs(normalised.std().item() - 1) < 1e-4
    own, _, _ = load_policy(str(tmp_path / "sft_small"))
    other = rm.gain * train_rm.sft_sample_scores(own, rm, tokenizer, prompts, cfg, ctx) + rm.bias
    assert abs(other.mean().item()) > 1e-3  # its own SFT's samples would have set other values


def test_rm_norm_policy_that_is_missing_exits_2(stages, tmp_path, capsys):
    exits_2_naming(capsys, "train_rm", ["--sft_dir", stages[0] / "sft", "--out_dir", tmp_path / "r",
                                        "--norm_policy", tmp_path / "nothing"], "--norm_policy")


def test_rm_resume_continues_exactly(stages, tmp_path):
    root, _, _ = stages  # root / "rm" is rm_cfg's run, uninterrupted
    killed_after_first_save(train_rm, rm_cfg(tmp_path / "killed", root / "sft"))
    train_rm.main(rm_cfg(tmp_path / "killed", root / "sft", resume=True))
    a = torch.load(root / "rm" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)["model"]
    assert_same_weights(a, b)  # includes the normalisation gain and bias


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_ppo_smoke_with_both_critics(stages, ppo_run, tmp_path, critic):
    root, _, _ = stages
    if critic == "separate":  # ppo_cfg's run: its --critic auto is separate with an RM
        tmp_path, summary = ppo_run
        assert summary["final"] and train_ppo.Config().critic == "auto"
    else:
        summary = train_ppo.main(ppo_cfg(tmp_path, root / "sft", root / "rm", critic=critic))
    lines = read_metrics(tmp_path)
    train_lines = [e for e in lines if "pg_loss" in e]
    assert len(train_lines) == 4
    for key in ["rm_score", "gold", "kl", "kl_coef", "entropy", "pg_loss", "vf_loss", "ptx_loss",
                "clipfrac", "approx_kl", "explained_var", "resp_len", "eos_rate", "t_generate",
                "t_score", "t_learn"]:
        assert key in train_lines[0], key
    assert summary["final"] and {"gold", "rm_score", "well_formed", "kl", "distinct2"} <= set(summary)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert (ckpt["critic"] is None) == (critic == "shared")


@pytest.fixture(scope="module")
def ppo_killed(stages, tmp_path_factory):
    """ppo_cfg's run killed right after its first checkpoint; a test resumes a copy."""
    root = stages[0]
    out = tmp_path_factory.mktemp("ppo_killed") / "killed"
    killed_after_first_save(train_ppo, ppo_cfg(out, root / "sft", root / "rm"))
    return out


@pytest.mark.parametrize("old_format", [False, True])
def test_ppo_resume_continues_exactly(stages, ppo_run, ppo_killed, tmp_path, old_format):
    root, _, _ = stages
    straight = ppo_run[0]  # ppo_cfg's run, uninterrupted
    copy_run(ppo_killed, tmp_path / "killed")
    if old_format:  # a checkpoint written before torchrun support: one process's RNG, flat
        path = tmp_path / "killed" / "ckpt.pt"
        ckpt = torch.load(path, weights_only=False)
        (own,) = ckpt["rng"]
        ckpt.update(rng=own["global"], sample_rng=own["sample"], shuffle_rng=own["shuffle"])
        torch.save(ckpt, path)
    train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True))
    a = torch.load(straight / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["kl_ctl"] == b["kl_ctl"] and a["kl_over_target"] == b["kl_over_target"]
    assert a["kl_ctl"]["value"] != 0.05  # the controller moved beta, so the check means something
    for part in ["actor", "critic"]:
        assert_same_weights(a[part], b[part])
    assert read_metrics(straight)[-1] == {
        **read_metrics(tmp_path / "killed")[-1], "time": read_metrics(straight)[-1]["time"]}


@pytest.mark.parametrize("option, value, started", [
    (["--kl_coef", "0.5"], "--kl_coef 0.05", "a fixed beta given anew"),
    (["--kl_in", "loss"], "--kl_in reward", "the KL moved from the reward to the loss"),
    (["--kl_estimator", "k2"], "--kl_estimator k1", "another estimator"),
    (["--clip_range", "0.1"], "--clip_range 0.2", "the policy loss"),
    (["--gamma", "0.9"], "--gamma 1.0", "the advantages"),
    (["--learn_tokens", "negative"], "--learn_tokens all", "which tokens learn"),
])
def test_ppo_resume_refuses_another_objective(stages, ppo_killed, tmp_path, capsys, option, value,
                                              started):
    """A resumed run trains what the first run trained: an option that changes the objective
    and differs from the checkpoint's is refused, naming its saved value (a fixed beta resumed
    with --kl_coef 0.5 printed 0.5 and saved 0.5 while training with 0.05)."""
    root = stages[0]
    copy_run(ppo_killed, tmp_path / "killed")
    cfg = ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True)
    line = exits_2(capsys, "train_ppo", [*as_options(cfg), *option])
    assert f"was started with {value}, not" in line and "start anew in another --out_dir" in line, line


def test_ppo_resume_takes_a_learning_rate_given_anew_and_says_so(stages, ppo_killed, tmp_path,
                                                                capsys):
    """The learning rates may change on resume when given on the command line: the run line
    says so and prints the controller's beta as saved; the optimizer steps at the new rate
    (its saved state brought the old peak back). Not given, the checkpoint's stays."""
    root = stages[0]
    copy_run(ppo_killed, tmp_path / "killed")
    saved = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    beta = saved["kl_ctl"]["value"]
    assert beta != 0.05  # the controller moved it before the kill
    run = train_ppo.set_up(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True,
                                   actor_lr=1e-4))
    out = capsys.readouterr().out
    assert f"beta {beta:.4g} (adaptive)" in out and "--actor_lr 0.0001 (5e-05 before the resume)" in out
    assert [g["peak_lr"] for g in run.trainer.actor_opt.adamw.param_groups] == [1e-4]
    run = train_ppo.set_up(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True))
    assert run.cfg.actor_lr == 5e-5 and "before the resume" not in capsys.readouterr().out


def test_ppo_refuses_a_reward_model_with_another_tokenizer(stages, tmp_path):
    root, _, _ = stages
    ckpt = torch.load(root / "rm" / "ckpt.pt", weights_only=False)
    ckpt["tokenizer"] = {"type": "word", "words": ["other", "words"]}
    os.makedirs(tmp_path / "rm")
    torch.save(ckpt, tmp_path / "rm" / "ckpt.pt")
    from mingpt_rlhf.machinery.errors import UserError
    with pytest.raises(UserError, match="another tokenizer"):
        train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", tmp_path / "rm"))


def run_script(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_each_script_run_as_a_program_exits_2_with_one_line():
    """`python X.py` with a mistake: status 2 and one line on stderr, no traceback, from the
    entry point under `if __name__ == "__main__":` to the process's exit. The other mistakes
    run in this process (conftest.exits_2), which starts no Python and no torch for each."""
    mistakes = [("train_sft.py", "--max_iters", "ten"), ("train_rm.py", "--sft_dir", "/nonexistent"),
                ("train_ppo.py", "--top_k", "-3"), ("train_dpo.py", "--beta", "0"),
                ("sample.py", "--prompt", "a", "--temperature", "0")]
    needles = ["--max_iters", "/nonexistent", "--top_k", "--beta", "--temperature"]
    started = [subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for args in mistakes]
    for process, needle in zip(started, needles):  # side by side: each mostly imports torch
        _, stderr = process.communicate(timeout=120)
        one_line_error(subprocess.CompletedProcess(process.args, process.returncode, "", stderr),
                       needle)


def one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def exits_2_naming(capsys, script, argv, *needles):
    """`script` run with `argv` in this process exits 2 with one line holding every needle."""
    line = exits_2(capsys, script, [str(a) for a in argv])
    for n in needles:
        assert n in line, line


def test_malformed_jsonl_line_exits_2_naming_file_and_line(tmp_path, capsys):
    bad = tmp_path / "demos.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"text": "fine"}\n{"prompt": "a", "resp\n')
    exits_2_naming(capsys, "train_sft", ["--data", bad, "--out_dir", tmp_path], f"{bad}:3")
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n')
    exits_2_naming(capsys, "train_sft", ["--data", bad, "--out_dir", tmp_path], f"{bad}:2",
                   "response")


def test_malformed_preference_line_exits_2(stages, tmp_path, capsys):
    root, _, _ = stages
    bad = tmp_path / "prefs.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": 3}\n')
    exits_2_naming(capsys, "train_rm", ["--data", bad, "--sft_dir", root / "sft",
                                        "--out_dir", tmp_path], f"{bad}:2", "rejected")


@pytest.mark.parametrize("args,needle", [
    (["train_ppo.py", "--top_k", "-3"], "--top_k"),
    (["train_ppo.py", "--critic", "both"], "--critic"),
    (["train_ppo.py", "--overlong_buffer", "4", "--penalize_missing_eos", "false"],
     "--overlong_buffer 4 would be ignored"),
    (["train_sft.py", "--max_iters", "ten"], "--max_iters"),
    (["train_sft.py", "--no_such_option", "1"], "no_such_option"),
    (["train_rm.py", "--sft_dir", "/nonexistent"], "/nonexistent"),
])
def test_bad_options_exit_2_with_one_line(args, needle, capsys):
    exits_2_naming(capsys, args[0].removesuffix(".py"), args[1:], needle)


def test_checkpoint_of_another_shape_is_refused(stages, tmp_path, capsys):
    root, _, _ = stages
    copy_run(root / "sft", tmp_path / "sft")
    exits_2_naming(capsys, "train_sft", ["--out_dir", tmp_path / "sft", "--resume",
                                         "--n_layer", "2", "--max_iters", "20"], "n_layer")


@pytest.mark.parametrize("script", ["train_sft.py", "train_rm.py", "train_ppo.py"])
def test_help_lists_every_option(script, capsys):
    module = {"train_sft.py": train_sft, "train_rm.py": train_rm, "train_ppo.py": train_ppo}[script]
    with pytest.raises(SystemExit) as exit_info:  # what `python script --help` runs
        cli.run(module.main, module.Config, ["--help"])
    assert exit_info.value.code == 0
    stdout = capsys.readouterr().out
    for f in dataclasses.fields(module.Config):
        assert f"--{f.name}" in stdout
    assert "default:" in stdout


# ---- GPT-2-scale options at tiny size: LoRA, gradient accumulation and checkpointing, fp16

def test_ppo_holds_out_eval_prompts_from_a_prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(100)))
    prompts = lambda rows: [r["prompt"] for r in rows]  # noqa: E731 (rows: a file's fields)
    train, held_out = map(prompts, train_ppo.prompt_splits(train_ppo.Config(prompts=str(path)), None))
    assert held_out and not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(f"p{i}" for i in range(100))
    other = tmp_path / "eval.jsonl"
    other.write_text(json.dumps({"prompt": "q"}) + "\n")
    cfg = train_ppo.Config(prompts=str(path), eval_prompts_file=str(other))
    assert tuple(map(prompts, train_ppo.prompt_splits(cfg, None))) == (
        [f"p{i}" for i in range(100)], ["q"])


def test_rm_gradient_accumulation_equals_one_big_batch(rm_unnormalised, tmp_path):
    big, cfg = rm_unnormalised  # batch 16, one step each
    assert (cfg.batch_size, cfg.grad_accum, cfg.norm_samples) == (16, 1, 0)
    accum = tmp_path / "accum"
    train_rm.main(dataclasses.replace(cfg, out_dir=str(accum), batch_size=8, grad_accum=2))
    a = torch.load(big / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(accum / "ckpt.pt", weights_only=False)["model"]
    for k in a:  # the same pairs in each step; float sums in another order, which Adam's
        # division by sqrt(v) amplifies for parameters whose gradients are near 0 (seen: 2.4e-4
        # after 10 steps with one thread)
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-3)
    losses = [[e["loss"] for e in read_metrics(run) if "loss" in e] for run in (big, accum)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def lora_ppo_cfg(out, sft_dir, rm_dir, **kw):
    return ppo_cfg(out, sft_dir, rm_dir, critic="separate", grad_checkpoint=True, lora_rank=4,
                   lora_alpha=8.0, **kw)


@pytest.fixture(scope="module")
def lora_ppo_killed(stages, tmp_path_factory):
    """lora_ppo_cfg's run from `stages` killed right after its first checkpoint; a test
    resumes a copy."""
    root = stages[0]
    out = tmp_path_factory.mktemp("lora_ppo_killed") / "killed"
    killed_after_first_save(train_ppo, lora_ppo_cfg(out, root / "sft", root / "rm"))
    return out


def test_lora_stages_write_merged_weights_and_resume_exactly(stages, lora_ppo_killed, tmp_path):
    """SFT, RM and PPO with LoRA: checkpoints hold merged GPT-2-named weights that the next
    stage loads as usual, and a killed PPO run resumes to the same adapters and weights."""
    root, _, _ = stages
    lora = dict(lora_rank=4, lora_alpha=8.0)
    train_sft.main(sft_cfg(tmp_path / "sft", init_from="", grad_checkpoint=True, grad_accum=2,
                           **lora))
    sft = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=False)
    assert not any("lora" in k for k in sft["model"])
    GPT(GPTConfig(**sft["model_config"])).load_state_dict(sft["model"])
    train_rm.main(rm_cfg(tmp_path / "rm", root / "sft", grad_checkpoint=True, **lora))
    rm = torch.load(tmp_path / "rm" / "ckpt.pt", weights_only=False)
    RewardModel(GPTConfig(**rm["model_config"])).load_state_dict(rm["model"])

    cfg = lambda out, **kw: lora_ppo_cfg(out, root / "sft", root / "rm", **kw)  # noqa: E731
    train_ppo.main(cfg(tmp_path / "straight"))
    copy_run(lora_ppo_killed, tmp_path / "killed")
    train_ppo.main(cfg(tmp_path / "killed", resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert set(a["actor"]["lora"]) and all("lora_" in k for k in a["actor"]["lora"])
    for part in [a["actor"]["lora"], a["critic"]["lora"], a["model"]]:
        other = {**b["actor"]["lora"], **b["critic"]["lora"], **b["model"]}
        for k in part:
            torch.testing.assert_close(part[k], other[k], rtol=0, atol=1e-6)
    GPT(GPTConfig(**a["model_config"])).load_state_dict(a["model"])  # merged, as usual


def test_lora_resume_refuses_a_changed_base(stages, lora_ppo_killed, tmp_path):
    root, _, _ = stages
    copy_run(lora_ppo_killed, tmp_path / "ppo")  # started from stages' SFT model, then killed
    copy_run(root / "sft", tmp_path / "sft")
    sft = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=False)
    sft["model"]["transformer.ln_f.bias"] += 0.1  # the SFT model was retrained meanwhile
    torch.save(sft, tmp_path / "sft" / "ckpt.pt")
    from mingpt_rlhf.machinery.errors import UserError
    with pytest.raises(UserError, match="base weights differ"):
        train_ppo.main(lora_ppo_cfg(tmp_path / "ppo", tmp_path / "sft", root / "rm", resume=True))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_runs_on_the_cpu(stages, tmp_path, dtype):
    """bf16 autocast (frozen models held in bf16) and fp16 with loss scaling, end to end."""
    root, _, _ = stages
    summary = train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", root / "rm", dtype=dtype,
                                     critic="separate", max_iters=2))
    assert summary["final"] and all(torch.isfinite(torch.tensor(v)) for v in summary.values()
                                    if isinstance(v, float))
    ckpt = torch.load(tmp_path / "ppo" / "ckpt.pt", weights_only=False)
    assert (ckpt["actor_opt"]["scaler"] is not None) == (dtype == "float16")
    sft = train_sft.main(sft_cfg(tmp_path / "sft", dtype=dtype, max_iters=4))
    sft32 = train_sft.main(sft_cfg(tmp_path / "sft32", max_iters=4))
    # the same 4 steps in float32: low precision moves the loss by its rounding, not more
    assert abs(sft["eval_loss"] - sft32["eval_loss"]) < 0.05, (sft["eval_loss"], sft32["eval_loss"])


@pytest.mark.parametrize("algo,controls,not_read", [
    ("ppo", ["--kl_coef", "--kl_horizon"], ["--dpo_beta"]),
    ("online_dpo", ["--dpo_beta"], ["--kl_coef", "--kl_horizon"])])
def test_ppo_warns_once_when_the_kl_stays_far_above_target(stages, tmp_path, capsys, algo,
                                                           controls, not_read):
    """A target no run can meet: over 2x the target in >= 10 % of the iterations -> one warning
    that names the options controlling the KL, those the run reads (online DPO's KL is its
    beta: it would refuse --kl_coef)."""
    root, _, _ = stages
    train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", root / "rm", kl_target=1e-4,
                           max_iters=4, actor_lr=1e-2, algo=algo))
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("warning: the KL to the SFT policy") == 1
    for option in [*controls, "--actor_lr", "--target_kl", "--kl_target"]:
        assert option in text
    for option in not_read:
        assert option not in text


@pytest.mark.parametrize("penalize", [True, False])
def test_ppo_warns_when_most_responses_are_cut_off_and_penalized(stages, tmp_path, capsys, penalize):
    """One token per response: almost none can end with EOS, so with the penalty on almost
    every score is --missing_eos_penalty; the first iteration says so and names the option
    that keeps the scores. With it off there is nothing to warn about."""
    root, _, _ = stages
    train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", root / "rm", max_new_tokens=1,
                           max_iters=2, eval_interval=2, eval_prompts=4,
                           penalize_missing_eos=penalize))
    out = capsys.readouterr()
    text = out.out + out.err
    assert read_metrics(tmp_path / "ppo")[1]["eos_rate"] < 0.1
    assert text.count("--penalize_missing_eos false") == (1 if penalize else 0), text


def test_adaptive_kl_with_a_zero_beta_is_refused(stages, tmp_path, capsys):
    root, _, _ = stages
    exits_2_naming(capsys, "train_ppo", ["--sft_dir", root / "sft", "--rm_dir", root / "rm",
                                         "--out_dir", tmp_path / "p", "--kl_coef", "0"], "--kl_coef 0")


@pytest.fixture(scope="module")
def critic_free_runs(stages, tmp_path_factory):
    """run(algo, **extra) -> (folder, [each update's rollout prompt ids]): ppo_cfg's run with
    --algo and --group_size 4 from `stages`, uninterrupted, made once on first use."""
    root, made = stages[0], {}

    def run(algo, **extra):
        key = (algo, *sorted(extra.items()))
        if key not in made:
            out = tmp_path_factory.mktemp(algo) / "straight"
            rollouts = []
            real = train_ppo.PPOTrainer.make_experience

            def spy(self, ids, mask, *args, **kwargs):
                if kwargs.get("for_update", True):
                    rollouts.append(ids.clone())
                return real(self, ids, mask, *args, **kwargs)
            with pytest.MonkeyPatch.context() as m:
                m.setattr(train_ppo.PPOTrainer, "make_experience", spy)
                train_ppo.main(ppo_cfg(out, root / "sft", root / "rm", algo=algo, group_size=4,
                                       **extra))
            made[key] = out, rollouts
        return made[key]
    return run


@pytest.mark.parametrize("algo,extra", [("grpo", {}), ("grpo", {"grpo_norm": "grpo", "kl_in": "loss"}),
                                        ("rloo", {}),
                                        ("grpo", {"dynamic_sampling": 2, "sampler_lag": 1,
                                                  "tis_cap": 2.0})])
def test_critic_free_runs_and_resumes_exactly(stages, critic_free_runs, tmp_path, algo, extra):
    root, _, _ = stages
    kw = dict(algo=algo, group_size=4, **extra)
    straight, _ = critic_free_runs(algo, **extra)
    killed_after_first_save(train_ppo, ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", **kw))
    train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True, **kw))
    a = torch.load(straight / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["stage"] == b["stage"] == algo and a["critic"] is None and a["value_head"] is None
    assert_same_weights(a["actor"], b["actor"])
    train = [e for e in read_metrics(straight) if "zero_groups" in e]
    # 16 responses in groups of 4 (a mean over the rollouts of an update): zero_groups counts
    # whole groups of 4, gen_tokens every token
    assert train and all((e["zero_groups"] * 4 * e.get("rollouts", 1)).is_integer() for e in train)
    # every rollout's tokens (dynamic sampling's refills too)
    assert all(abs(e["gen_tokens"] - 16 * e.get("rollouts", 1) * e["resp_len"]) < 1e-2 for e in train)
    assert ("kl_loss" in train[0]) == (extra.get("kl_in") == "loss")
    if "sampler_lag" in extra:  # the first rollout is the learner's own; later ones lag it
        assert train[0]["mismatch_kl"] < 1e-6 < train[-1]["mismatch_kl"]
        assert b["sampler_behind"] is not None


def test_critic_free_groups_are_one_prompt_repeated(critic_free_runs):
    """The rollout batch of --algo grpo holds rollout_batch_size / group_size prompts, each
    group_size times in consecutive rows."""
    _, rollouts = critic_free_runs("grpo")
    assert len(rollouts) == 4  # one per iteration
    ids = rollouts[0]
    assert len(ids) == 16
    groups = ids.view(4, 4, -1)
    assert (groups == groups[:, :1]).all()
    assert len({tuple(g[0].tolist()) for g in groups}) > 1  # different prompts across groups


@pytest.mark.parametrize("args,message", [
    (["--algo", "a2c"], "--algo"),
    (["--algo", "grpo", "--group_size", "5"], "multiple of"),
    (["--algo", "grpo", "--grpo_norm", "grpo", "--kl_in", "reward"], "--kl_in loss"),
    (["--algo", "grpo", "--grpo_norm", "x"], "--grpo_norm"),
    (["--algo", "rloo", "--reduction", "max"], "--reduction"),
    (["--generate_batch_size", "-1"], "--generate_batch_size"),
])
def test_critic_free_bad_options_exit_2(stages, tmp_path, capsys, args, message):
    root, _, _ = stages
    exits_2_naming(capsys, "train_ppo", ["--sft_dir", root / "sft", "--rm_dir", root / "rm",
                                         "--out_dir", tmp_path / "p", *args], message)


def dpo_cfg(out_dir, sft_dir, **kw):
    import train_dpo
    base = dict(out_dir=str(out_dir), sft_dir=str(sft_dir), n_pairs=160, batch_size=16,
                eval_interval=4, eval_prompts=16)
    return train_dpo.Config(**{**base, **kw})


def test_dpo_runs_logs_its_figures_and_resumes_exactly(stages, dpo_run, tmp_path):
    import train_dpo
    root, _, _ = stages
    straight, _, summary = dpo_run  # dpo_cfg's run with the RM scoring its eval, uninterrupted
    assert {"gold", "well_formed", "kl", "distinct2", "rm_score"} <= set(summary)
    lines = read_metrics(straight)
    first = next(e for e in lines if "reward_acc" in e)
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy = reference: log 2
    assert {"margin", "chosen_reward", "rejected_reward"} <= set(first)
    killed_after_first_save(train_dpo, dpo_cfg(tmp_path / "killed", root / "sft",
                                               rm_dir=str(root / "rm")))
    train_dpo.main(dpo_cfg(tmp_path / "killed", root / "sft", rm_dir=str(root / "rm"), resume=True))
    a = torch.load(straight / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["stage"] == "dpo"
    assert_same_weights(a["model"], b["model"])
    # a policy checkpoint: loads as the start of a later stage
    from mingpt_rlhf.stages import load_policy
    load_policy(str(straight))


def test_dpo_with_lora_uses_the_adapters_off_as_reference(stages, tmp_path):
    import train_dpo
    root, _, _ = stages
    train_dpo.main(dpo_cfg(tmp_path / "d", root / "sft", lora_rank=4, nll_coef=0.5))
    first = next(e for e in read_metrics(tmp_path / "d") if "reward_acc" in e)
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # the DPO loss alone
    assert first["chosen_nll"] > 0  # the chosen responses' LM loss, nats per token


@pytest.mark.parametrize("args,message", [(["--loss", "kto"], "--loss"), (["--beta", "0"], "--beta")])
def test_dpo_bad_options_exit_2(stages, tmp_path, capsys, args, message):
    root, _, _ = stages
    exits_2_naming(capsys, "train_dpo", ["--sft_dir", root / "sft", "--out_dir", tmp_path / "d",
                                         *args], message)


def test_ptx_coef_auto_is_on_for_ppo_and_off_for_the_critic_free_methods():
    for algo, expected in [("ppo", 0.02), ("grpo", 0.0), ("rloo", 0.0)]:
        cfg = train_ppo.Config(algo=algo)
        train_ppo.check_config(cfg)
        assert cfg.ptx_coef == expected
    cfg = train_ppo.Config(algo="rloo", ptx_coef=0.1)
    train_ppo.check_config(cfg)
    assert cfg.ptx_coef == 0.1


@pytest.mark.parametrize("argv,expected", [
    (["--env", "guess", "--algo", "ppo"], 1e-4),         # an environment's rewards
    (["--reward", "task"], 1e-4),                         # the task's own check
    ([], 5e-5),                                           # the reward model
    (["--reward", "my_reward.py:score"], 5e-5),           # a user's function
])
def test_actor_lr_auto_follows_the_reward_source_as_the_script_parses_it(argv, expected):
    # the command line as train_ppo.py reads it; --env must set the reward's source before
    # the auto options resolve, or episodes train at the reward model's rate
    cfg = cli.parse_config(train_ppo.Config, argv)
    train_ppo.check_config(cfg)
    assert cfg.actor_lr == expected
