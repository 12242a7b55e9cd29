"""On-policy distillation (methods/distill.py, --algo distill): the reward of every sampled token
is -(log pi_student - log pi_teacher), checked against the two models' logits by hand; the
sequence form gives each response RLOO's advantage of its summed reward, the token form each
token its own; the script refuses what makes no sense with it, and a run resumes exactly."""
import copy
import dataclasses

import pytest
import torch

import train_ppo
from conftest import copy_run, exits_2
from mingpt_rlhf.methods.distill import NoScore
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.ppo import FixedKLController
from mingpt_rlhf.ppo_trainer import PPOTrainer
from test_ppo_trainer import EOS, PAD, Cfg, prompts
from test_scripts import assert_same_weights, killed_after_first_save, ppo_cfg


@dataclasses.dataclass
class DistillCfg(Cfg):
    distill_form: str = "sequence"


def distiller(form: str, seed=0):
    """A student and a teacher (the student moved by noise), and the trainer of --algo distill
    with the given --distill_form, as the script builds it: the teacher in the reference's
    place, no score, beta 1."""
    torch.manual_seed(seed)
    student = GPT(GPTConfig(vocab_size=8, block_size=24, n_layer=1, n_head=2, n_embd=32))
    teacher = copy.deepcopy(student).requires_grad_(False)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    cfg = DistillCfg(algo="distill", kl_in="auto", group_size=4, distill_form=form)
    return PPOTrainer(cfg, student, teacher, NoScore(), eos_id=EOS, pad_id=PAD,
                      kl_ctl=FixedKLController(1.0))


def by_hand(model, exp):
    """(B, N) log-probs of each response token from the model's full logits (PAD never
    sampled, so its column is left out of the softmax, as the trainer does)."""
    T = exp.prompt_len
    with torch.no_grad():
        logits = model(exp.sequences, exp.attention_mask)[:, T - 1:-1].float()
    logits[..., PAD] = float("-inf")
    logp = torch.log_softmax(logits, -1).gather(-1, exp.sequences[:, T:, None]).squeeze(-1)
    return torch.where(exp.action_mask.bool(), logp, 0.0)


@pytest.mark.parametrize("form", ["sequence", "token"])
def test_each_tokens_reward_is_minus_its_log_ratio_to_the_teacher(form):
    tr = distiller(form)
    ids, mask = prompts(8)
    group = (ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0))  # groups of 4
    exp, stats = tr.make_experience(*group, torch.Generator().manual_seed(0))
    am = exp.action_mask
    reward = -(by_hand(tr.actor, exp) - by_hand(tr.ref, exp)) * am     # (B, N) by hand
    assert reward.abs().max() > 0.05  # the teacher differs: the check means something
    assert stats["rm_score"] == 0.0  # no score: the teacher's log-probs are the whole reward
    if form == "token":  # each token's own reward is its advantage
        torch.testing.assert_close(exp.rewards, reward, atol=1e-5, rtol=0)
        torch.testing.assert_close(exp.advantages, reward, atol=1e-5, rtol=0)
    else:  # each response's sum, with the leave-one-out baseline of its group of 4
        total = reward.sum(-1).view(-1, 4)
        loo = total - (total.sum(-1, keepdim=True) - total) / 3
        torch.testing.assert_close(exp.rewards, total.flatten()[:, None] * am, atol=1e-5, rtol=0)
        torch.testing.assert_close(exp.advantages, loo.flatten()[:, None] * am, atol=1e-5, rtol=0)
    # the logged KL is the student's to its teacher, per response
    assert stats["kl"] == pytest.approx(-reward.sum(-1).mean().item(), abs=1e-5)


def test_the_script_refuses_what_makes_no_sense_with_distillation(stages, tmp_path, capsys):
    root = stages[0]
    base = ["--out_dir", str(tmp_path / "d"), "--sft_dir", str(root / "sft"), "--algo", "distill"]
    teacher = ["--teacher_dir", str(root / "sft")]
    cases = [([], "needs --teacher_dir"),
             (teacher + ["--kl_coef", "0.5"], "--kl_coef 0.5 would be ignored"),
             (teacher + ["--critic", "shared"], "--critic shared would be ignored"),
             (teacher + ["--reward", "task"], "drop --reward task"),
             (teacher + ["--env", "guess"], "drop --env"),
             (teacher + ["--penalize_missing_eos", "false"], "would be ignored"),
             (["--teacher_dir", str(root / "rm")], "is a reward model, not a policy")]
    for extra, needle in cases:
        line = exits_2(capsys, "train_ppo", base + extra)
        assert needle in line, line
    line = exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "g"), "--teacher_dir",
                                         str(root / "sft")])
    assert "--teacher_dir" in line and "with --algo distill" in line, line


def test_a_teacher_of_another_tokenizer_is_refused(stages, tmp_path, capsys):
    root = stages[0]
    teacher = copy_run(root / "sft", tmp_path / "teacher")
    ckpt = torch.load(teacher / "ckpt.pt", weights_only=False)
    ckpt["tokenizer"] = {"type": "word", "words": ["other", "words"]}
    torch.save(ckpt, teacher / "ckpt.pt")
    line = exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "d"), "--sft_dir",
                                         str(root / "sft"), "--algo", "distill", "--teacher_dir",
                                         str(teacher)])
    assert "another tokenizer than the student" in line, line


def distill_cfg(out, root, **kw):
    return ppo_cfg(out, root / "sft", root / "rm", **{"algo": "distill", "group_size": 4,
                                                      "teacher_dir": str(root / "teacher"), **kw})


@pytest.fixture(scope="module")
def teacher_root(stages, tmp_path_factory):
    """The shared SFT policy, and a teacher far from it: its checkpoint with noise added to
    every weight (a policy of the same shapes and tokenizer that writes otherwise)."""
    root = tmp_path_factory.mktemp("distill")
    for name in ("sft", "rm"):
        copy_run(stages[0] / name, root / name)
    ckpt = torch.load(root / "sft" / "ckpt.pt", weights_only=False)
    gen = torch.Generator().manual_seed(0)
    ckpt["model"] = {k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                     for k, v in ckpt["model"].items()}
    (root / "teacher").mkdir()
    torch.save(ckpt, root / "teacher" / "ckpt.pt")
    return root


@pytest.mark.parametrize("lora", [0, 4])
def test_a_distillation_run_learns_from_its_teacher_and_resumes_exactly(teacher_root, tmp_path,
                                                                        lora):
    """The student moves towards the teacher (its KL to it falls, from a start that differs),
    with LoRA too (the teacher is then still a model of its own: the student with its adapters
    off would be the SFT policy); a run killed at its first checkpoint resumes to the
    uninterrupted run's weights; the teacher cannot change on resume."""
    root = teacher_root
    kw = dict(lora_rank=lora, actor_lr=1e-2, target_kl=0.0, max_iters=10, eval_interval=5)
    train_ppo.main(distill_cfg(tmp_path / "straight", root, **kw))
    evals = [r["kl"] for r in train_ppo.read_metrics(str(tmp_path / "straight" / "metrics.jsonl"))
             if r.get("split") == "eval"]
    assert evals[0] > 0.05 and evals[-1] < evals[0], evals  # the KL to the teacher falls
    killed_after_first_save(train_ppo, distill_cfg(tmp_path / "killed", root, **kw))
    train_ppo.main(distill_cfg(tmp_path / "killed", root, resume=True, **kw))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert_same_weights(a["actor"], b["actor"])
    with pytest.raises(Exception, match="was started with --teacher_dir"):
        train_ppo.main(distill_cfg(tmp_path / "killed", root, resume=True,
                                   teacher_dir=str(root / "sft"), **kw))


def test_a_teachers_samples_become_demonstrations_that_sft_reads(stages, tmp_path, capsys):
    """Off-policy distillation's two commands: sample.py --out writes the teacher's responses
    as {"prompt", "response"} lines (EOS left out; cut-off responses left out and counted), and
    train_sft.py --data trains on them."""
    import json

    import sample
    import train_sft
    from test_scripts import sft_cfg
    root = stages[0]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n"
                               for p in ["the plot was", "the cast felt", "the music seemed"]))
    out = tmp_path / "teacher.jsonl"
    sample.main(sample.Config(ckpt_dir=str(root / "sft"), prompts=str(prompts), num_samples=4,
                              max_new_tokens=24, out=str(out)))
    said = capsys.readouterr().out.splitlines()[-1]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    kept, cut = int(said.split()[1]), int(said.split("(")[1].split()[0])
    assert said.startswith("wrote") and kept == len(lines) and kept + cut == 12, said
    assert lines and all(set(r) == {"prompt", "response"} and "<eos>" not in r["response"]
                         for r in lines)
    summary = train_sft.main(sft_cfg(tmp_path / "sft", data=str(out), max_iters=4, eval_interval=2))
    assert summary["final"]
    with pytest.raises(Exception, match="--out writes the answers"):
        sample.main(sample.Config(ckpt_dir=str(root / "sft"), out=str(out)))
