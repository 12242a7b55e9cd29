"""The three scripts at tiny size: smoke runs, exact resume after a kill, exit status 2."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train_ppo
import train_rm
import train_sft
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


def test_sft_resume_continues_exactly(tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train_sft.main(sft_cfg(straight))
    killed = tmp_path / "killed"
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_sft)
        with pytest.raises(Killed):
            train_sft.main(sft_cfg(killed))
    assert torch.load(killed / "ckpt.pt", weights_only=False)["step"] == 10
    train_sft.main(sft_cfg(killed, resume=True))
    a = torch.load(straight / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(killed / "ckpt.pt", weights_only=False)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
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


def test_rm_resume_continues_exactly(stages, tmp_path, monkeypatch):
    root, _, _ = stages
    train_rm.main(rm_cfg(tmp_path / "straight", root / "sft"))
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_rm)
        with pytest.raises(Killed):
            train_rm.main(rm_cfg(tmp_path / "killed", root / "sft"))
    train_rm.main(rm_cfg(tmp_path / "killed", root / "sft", resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)["model"]
    for k in a:  # includes the normalisation gain and bias
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_ppo_smoke_with_both_critics(stages, tmp_path, critic):
    root, _, _ = stages
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


@pytest.mark.parametrize("old_format", [False, True])
def test_ppo_resume_continues_exactly(stages, tmp_path, monkeypatch, old_format):
    root, _, _ = stages
    train_ppo.main(ppo_cfg(tmp_path / "straight", root / "sft", root / "rm"))
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm"))
    if old_format:  # a checkpoint written before torchrun support: one process's RNG, flat
        path = tmp_path / "killed" / "ckpt.pt"
        ckpt = torch.load(path, weights_only=False)
        (own,) = ckpt["rng"]
        ckpt.update(rng=own["global"], sample_rng=own["sample"], shuffle_rng=own["shuffle"])
        torch.save(ckpt, path)
    train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["kl_ctl"] == b["kl_ctl"] and a["kl_over_target"] == b["kl_over_target"]
    assert a["kl_ctl"]["value"] != 0.05  # the controller moved beta, so the check means something
    for part in ["actor", "critic"]:
        for k in a[part]:
            torch.testing.assert_close(a[part][k], b[part][k], rtol=0, atol=1e-6)
    assert read_metrics(tmp_path / "straight")[-1] == {
        **read_metrics(tmp_path / "killed")[-1], "time": read_metrics(tmp_path / "straight")[-1]["time"]}


def test_ppo_refuses_a_reward_model_with_another_tokenizer(stages, tmp_path):
    root, _, _ = stages
    ckpt = torch.load(root / "rm" / "ckpt.pt", weights_only=False)
    ckpt["tokenizer"] = {"type": "word", "words": ["other", "words"]}
    os.makedirs(tmp_path / "rm")
    torch.save(ckpt, tmp_path / "rm" / "ckpt.pt")
    from mingpt_rlhf.errors import UserError
    with pytest.raises(UserError, match="another tokenizer"):
        train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", tmp_path / "rm"))


def run_script(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_malformed_jsonl_line_exits_2_naming_file_and_line(tmp_path):
    bad = tmp_path / "demos.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"text": "fine"}\n{"prompt": "a", "resp\n')
    one_line_error(run_script("train_sft.py", "--data", str(bad), "--out_dir", str(tmp_path)),
                   f"{bad}:3")
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n')
    one_line_error(run_script("train_sft.py", "--data", str(bad), "--out_dir", str(tmp_path)),
                   f"{bad}:2", "response")


def test_malformed_preference_line_exits_2(stages, tmp_path):
    root, _, _ = stages
    bad = tmp_path / "prefs.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": 3}\n')
    one_line_error(run_script("train_rm.py", "--data", str(bad), "--sft_dir", str(root / "sft"),
                              "--out_dir", str(tmp_path)), f"{bad}:2", "rejected")


@pytest.mark.parametrize("args,needle", [
    (["train_ppo.py", "--top_k", "-3"], "--top_k"),
    (["train_ppo.py", "--critic", "both"], "--critic"),
    (["train_sft.py", "--max_iters", "ten"], "--max_iters"),
    (["train_sft.py", "--no_such_option", "1"], "no_such_option"),
    (["train_rm.py", "--sft_dir", "/nonexistent"], "/nonexistent"),
])
def test_bad_options_exit_2_with_one_line(args, needle):
    one_line_error(run_script(*args), needle)


def test_checkpoint_of_another_shape_is_refused(stages, tmp_path):
    root, _, _ = stages
    import shutil
    shutil.copytree(root / "sft", tmp_path / "sft")
    one_line_error(run_script("train_sft.py", "--out_dir", str(tmp_path / "sft"), "--resume",
                              "--n_layer", "2", "--max_iters", "20"), "n_layer")


@pytest.mark.parametrize("script", ["train_sft.py", "train_rm.py", "train_ppo.py"])
def test_help_lists_every_option(script):
    result = run_script(script, "--help")
    assert result.returncode == 0
    module = {"train_sft.py": train_sft, "train_rm.py": train_rm, "train_ppo.py": train_ppo}[script]
    import dataclasses
    for f in dataclasses.fields(module.Config):
        assert f"--{f.name}" in result.stdout
    assert "default:" in result.stdout


# ---- GPT-2-scale options at tiny size: LoRA, gradient accumulation and checkpointing, fp16

def test_ppo_holds_out_eval_prompts_from_a_prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(100)))
    train, held_out = train_ppo.prompt_splits(train_ppo.Config(prompts=str(path)), None)
    assert held_out and not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(f"p{i}" for i in range(100))
    other = tmp_path / "eval.jsonl"
    other.write_text(json.dumps({"prompt": "q"}) + "\n")
    cfg = train_ppo.Config(prompts=str(path), eval_prompts_file=str(other))
    assert train_ppo.prompt_splits(cfg, None) == ([f"p{i}" for i in range(100)], ["q"])


def test_rm_gradient_accumulation_equals_one_big_batch(stages, tmp_path):
    root, _, _ = stages
    for name, batch, accum in [("big", 16, 1), ("accum", 8, 2)]:
        train_rm.main(rm_cfg(tmp_path / name, root / "sft", batch_size=batch, grad_accum=accum,
                             norm_samples=0))
    a = torch.load(tmp_path / "big" / "ckpt.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "accum" / "ckpt.pt", weights_only=False)["model"]
    for k in a:  # the same pairs in each step; float sums in another order, which Adam's
        # division by sqrt(v) amplifies for parameters whose gradients are near 0 (seen: 2.4e-4
        # after 10 steps with one thread)
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-3)
    losses = [[e["loss"] for e in read_metrics(tmp_path / name) if "loss" in e]
              for name in ("big", "accum")]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_lora_stages_write_merged_weights_and_resume_exactly(stages, tmp_path, monkeypatch):
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

    cfg = lambda out, **kw: ppo_cfg(out, root / "sft", root / "rm", critic="separate",
                                    grad_checkpoint=True, **lora, **kw)
    train_ppo.main(cfg(tmp_path / "straight"))
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            train_ppo.main(cfg(tmp_path / "killed"))
    train_ppo.main(cfg(tmp_path / "killed", resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert set(a["actor"]["lora"]) and all("lora_" in k for k in a["actor"]["lora"])
    for part in [a["actor"]["lora"], a["critic"]["lora"], a["model"]]:
        other = {**b["actor"]["lora"], **b["critic"]["lora"], **b["model"]}
        for k in part:
            torch.testing.assert_close(part[k], other[k], rtol=0, atol=1e-6)
    GPT(GPTConfig(**a["model_config"])).load_state_dict(a["model"])  # merged, as usual


def test_lora_resume_refuses_a_changed_base(stages, tmp_path, monkeypatch):
    root, _, _ = stages
    import shutil
    shutil.copytree(root / "sft", tmp_path / "sft")
    cfg = lambda **kw: ppo_cfg(tmp_path / "ppo", tmp_path / "sft", root / "rm", critic="shared",
                               lora_rank=2, **kw)
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            train_ppo.main(cfg())
    sft = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=False)
    sft["model"]["transformer.ln_f.bias"] += 0.1  # the SFT model was retrained meanwhile
    torch.save(sft, tmp_path / "sft" / "ckpt.pt")
    from mingpt_rlhf.errors import UserError
    with pytest.raises(UserError, match="base weights differ"):
        train_ppo.main(cfg(resume=True))


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
    assert summary["final"] and sft["eval_loss"] < 10


def test_ppo_warns_once_when_the_kl_stays_far_above_target(stages, tmp_path, capsys):
    """A target no run can meet: over 2x the target in >= 10 % of the iterations -> one warning
    that names the options controlling the KL."""
    root, _, _ = stages
    train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", root / "rm", kl_target=1e-4,
                           max_iters=4, actor_lr=1e-2))
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("warning: the KL to the SFT policy") == 1
    for option in ["--kl_coef", "--kl_horizon", "--actor_lr", "--target_kl", "--kl_target"]:
        assert option in text


def test_adaptive_kl_with_a_zero_beta_is_refused(stages, tmp_path):
    root, _, _ = stages
    r = subprocess.run([sys.executable, "train_ppo.py", "--sft_dir", str(root / "sft"),
                        "--rm_dir", str(root / "rm"), "--out_dir", str(tmp_path / "p"),
                        "--kl_coef", "0"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--kl_coef 0" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("algo,extra", [("grpo", {}), ("grpo", {"grpo_norm": "grpo", "kl_in": "loss"}),
                                        ("rloo", {})])
def test_critic_free_runs_and_resumes_exactly(stages, tmp_path, monkeypatch, algo, extra):
    root, _, _ = stages
    kw = dict(algo=algo, group_size=4, **extra)
    train_ppo.main(ppo_cfg(tmp_path / "straight", root / "sft", root / "rm", **kw))
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", **kw))
    train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True, **kw))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["stage"] == b["stage"] == algo and a["critic"] is None and a["value_head"] is None
    for k in a["actor"]:
        torch.testing.assert_close(a["actor"][k], b["actor"][k], rtol=0, atol=1e-6)
    train = [e for e in read_metrics(tmp_path / "straight") if "zero_groups" in e]
    assert train and all(0 <= e["zero_groups"] <= 1 and e["gen_tokens"] > 0 for e in train)
    assert ("kl_loss" in train[0]) == (extra.get("kl_in") == "loss")


def test_critic_free_groups_are_one_prompt_repeated(stages, tmp_path, monkeypatch):
    """The rollout batch of --algo grpo holds rollout_batch_size / group_size prompts, each
    group_size times in consecutive rows."""
    root, _, _ = stages
    seen = []
    real = train_ppo.PPOTrainer.make_experience

    def spy(self, ids, mask, *args, **kwargs):
        if kwargs.get("for_update", True):
            seen.append(ids.clone())
        return real(self, ids, mask, *args, **kwargs)
    monkeypatch.setattr(train_ppo.PPOTrainer, "make_experience", spy)
    train_ppo.main(ppo_cfg(tmp_path / "g", root / "sft", root / "rm", algo="grpo", group_size=4,
                           max_iters=1))
    ids = seen[0]
    assert len(ids) == 16
    groups = ids.view(4, 4, -1)
    assert (groups == groups[:, :1]).all()
    assert len({tuple(g[0].tolist()) for g in groups}) > 1  # different prompts across groups


@pytest.mark.parametrize("args,message", [
    (["--algo", "a2c"], "--algo"),
    (["--algo", "grpo", "--group_size", "5"], "multiple of"),
    (["--algo", "ppo", "--kl_in", "loss"], "--kl_in loss"),
    (["--algo", "grpo", "--grpo_norm", "x"], "--grpo_norm"),
    (["--algo", "rloo", "--reduction", "max"], "--reduction"),
    (["--generate_batch_size", "-1"], "--generate_batch_size"),
])
def test_critic_free_bad_options_exit_2(stages, tmp_path, args, message):
    root, _, _ = stages
    r = subprocess.run([sys.executable, "train_ppo.py", "--sft_dir", str(root / "sft"),
                        "--rm_dir", str(root / "rm"), "--out_dir", str(tmp_path / "p"), *args],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def dpo_cfg(out_dir, sft_dir, **kw):
    import train_dpo
    base = dict(out_dir=str(out_dir), sft_dir=str(sft_dir), n_pairs=160, batch_size=16,
                eval_interval=4, eval_prompts=16)
    return train_dpo.Config(**{**base, **kw})


def test_dpo_runs_logs_its_figures_and_resumes_exactly(stages, tmp_path, monkeypatch):
    import train_dpo
    root, _, _ = stages
    summary = train_dpo.main(dpo_cfg(tmp_path / "straight", root / "sft", rm_dir=str(root / "rm")))
    assert {"gold", "well_formed", "kl", "distinct2", "rm_score"} <= set(summary)
    lines = read_metrics(tmp_path / "straight")
    first = next(e for e in lines if "reward_acc" in e)
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy = reference: log 2
    assert {"margin", "chosen_reward", "rejected_reward"} <= set(first)
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_dpo)
        with pytest.raises(Killed):
            train_dpo.main(dpo_cfg(tmp_path / "killed", root / "sft", rm_dir=str(root / "rm")))
    train_dpo.main(dpo_cfg(tmp_path / "killed", root / "sft", rm_dir=str(root / "rm"), resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert a["stage"] == "dpo"
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=1e-6)
    # a policy checkpoint: loads as the start of a later stage
    from mingpt_rlhf.checkpoint import load_policy
    load_policy(str(tmp_path / "straight"))


def test_dpo_with_lora_uses_the_adapters_off_as_reference(stages, tmp_path):
    import train_dpo
    root, _, _ = stages
    train_dpo.main(dpo_cfg(tmp_path / "d", root / "sft", lora_rank=4, nll_coef=0.5))
    first = next(e for e in read_metrics(tmp_path / "d") if "reward_acc" in e)
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)  # the DPO loss alone
    assert first["chosen_nll"] > 0  # the chosen responses' LM loss, nats per token


@pytest.mark.parametrize("args,message", [(["--loss", "kto"], "--loss"), (["--beta", "0"], "--beta")])
def test_dpo_bad_options_exit_2(stages, tmp_path, args, message):
    root, _, _ = stages
    r = subprocess.run([sys.executable, "train_dpo.py", "--sft_dir", str(root / "sft"),
                        "--out_dir", str(tmp_path / "d"), *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_ptx_coef_auto_is_on_for_ppo_and_off_for_the_critic_free_methods():
    for algo, expected in [("ppo", 0.02), ("grpo", 0.0), ("rloo", 0.0)]:
        cfg = train_ppo.Config(algo=algo)
        train_ppo.check_config(cfg)
        assert cfg.ptx_coef == expected
    cfg = train_ppo.Config(algo="rloo", ptx_coef=0.1)
    train_ppo.check_config(cfg)
    assert cfg.ptx_coef == 0.1
