"""--learn_batch_size: a minibatch learnt in slices, their gradients summed before its one step,
is the same update as the whole minibatch at once, for every loss the trainer forms (token,
sequence and budget reductions, the KL in the loss, the entropy bonus, a shared or separate
critic, ptx), and stops early on the same approx-KL."""
import math
from dataclasses import dataclass

import pytest
import torch

import conftest
from mingpt_rlhf.ppo_trainer import resolve_auto_options
from test_critic_free import grouped_prompts
from test_ppo_trainer import Cfg, make_trainer, prompts


@dataclass
class SliceCfg(Cfg):
    learn_batch_size: int = 0
    ratio: str = "token"
    learn_tokens: str = "all"
    top_entropy_quantile: float = 0.2


def learnt(cfg, shared=True, critic_free=False, ptx_data=None):
    """The gradients of every optimizer step (actor, critic) of one make_experience + learn,
    from the same start and the same batch, and the figures of the update. Gradients, not
    weights: AdamW divides each by its own running scale, so a gradient of 1e-9 that rounds
    differently moves its weight by a full step either way."""
    tr = make_trainer(resolve_auto_options(cfg), shared=shared, critic_free=critic_free,
                      ptx_data=ptx_data)
    batch = grouped_prompts(4, 4) if critic_free else prompts(16)
    exp, _ = tr.make_experience(*batch, torch.Generator().manual_seed(0))
    tr.buffer.add(exp)
    grads = []
    for opt in (tr.actor_opt, tr.critic_opt):
        if opt is not None:
            real = opt.step
            opt.step = lambda real=real, opt=opt: (grads.append(
                [p.grad.clone() for g in opt.adamw.param_groups for p in g["params"]]), real())[1]
    stats = tr.learn(torch.Generator().manual_seed(1))
    return grads, stats


@pytest.mark.parametrize("options,shared,critic_free", [
    (dict(algo="ppo"), True, False),                                     # token mean + value head
    (dict(algo="ppo", entropy_coef=0.01), False, False),                 # separate critic
    (dict(algo="grpo", group_size=4), True, True),                       # budget sum
    (dict(algo="grpo", group_size=4, grpo_norm="grpo", kl_in="loss"), True, True),  # sequence, k3
    (dict(algo="rloo", group_size=4, entropy_coef=0.05), True, True),
    (dict(algo="grpo", group_size=4, ratio="sequence"), True, True),     # GSPO's sequence ratio
    (dict(algo="grpo", group_size=4, learn_tokens="top_entropy"), True, True),  # a token mask
], ids=["ppo-shared", "ppo-separate-entropy", "dr-grpo", "grpo-std-kl-loss", "rloo-entropy",
        "gspo", "top-entropy"])
def test_slices_learn_what_the_whole_minibatch_learns(options, shared, critic_free):
    base = dict(minibatch_size=8, ppo_epochs=2, actor_lr=1e-2, critic_lr=1e-2, **options)
    whole, whole_stats = learnt(SliceCfg(**base), shared, critic_free)
    sliced, sliced_stats = learnt(SliceCfg(learn_batch_size=2, **base), shared, critic_free)
    assert len(whole) == len(sliced) == 4 * (1 if shared or critic_free else 2)
    for i, (step_whole, step_sliced) in enumerate(zip(whole, sliced)):
        scale = max(g.abs().max().item() for g in step_whole)
        assert scale > 1e-4                                               # a real gradient
        # the first step's to float32 rounding; later ones start from weights that rounded
        # apart (AdamW turns a rounding of a tiny gradient into a step), so a little looser
        for a, b in zip(step_whole, step_sliced):
            torch.testing.assert_close(a, b, rtol=0, atol=(1e-5 if i == 0 else 1e-3) * scale)
    for k in ("pg_loss", "approx_kl", "clipfrac", "policy_entropy"):
        assert sliced_stats[k] == pytest.approx(whole_stats[k], abs=1e-5), k
    assert sliced_stats["minibatch_steps"] == whole_stats["minibatch_steps"] == 4


def test_slices_stop_early_where_the_whole_minibatch_does():
    base = dict(algo="ppo", minibatch_size=8, ppo_epochs=4, actor_lr=3e-2, target_kl=1e-3)
    whole, whole_stats = learnt(SliceCfg(**base))
    sliced, sliced_stats = learnt(SliceCfg(learn_batch_size=4, **base))
    assert 0 < whole_stats["minibatch_steps"] == sliced_stats["minibatch_steps"] < 8
    assert len(whole) == len(sliced) == whole_stats["minibatch_steps"]    # no step when stopped


def test_online_dpo_refuses_slices_of_a_minibatch():
    """Its loss is a mean over the pairs with a preference (a tie is kept with signs 0 and
    counts for nothing); a slice would divide by its own count of them, so 4 pairs in 2
    slices, one of them tied, would weigh the tied slice's other pair twice as much as each
    pair of the other slice."""
    cfg = resolve_auto_options(SliceCfg(algo="online_dpo", group_size=2, minibatch_size=8,
                                        learn_batch_size=4))
    with pytest.raises(ValueError, match="online_dpo learns each minibatch whole"):
        make_trainer(cfg, critic_free=True)
    make_trainer(resolve_auto_options(SliceCfg(algo="online_dpo", group_size=2)), critic_free=True)


def test_a_learn_batch_that_does_not_divide_the_minibatch_is_refused(tmp_path, capsys):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"),
                                                  "--minibatch_size", "16", "--learn_batch_size", "5"])
    assert "--learn_batch_size 5 must divide" in line, line


def test_approx_kl_over_slices_is_the_whole_minibatchs_for_every_policy_loss():
    """Two slices of two rows: one of 1 token a row (log-ratios -0.5 and 0.4), one of 3 tokens
    a row, unmoved. Over the 8 tokens: (k3(-0.5) + k3(0.4)) / 8 = 0.0248, k3(x) = e^x - 1 - x.
    Each slice divides by the whole minibatch's count / 2 slices (what the trainer passes) and
    the trainer adds each slice's figure / 2; a slice-mean would give 0.0496 instead."""
    from mingpt_rlhf.losses import LossSpec, actor_loss
    k3 = lambda x: math.exp(x) - 1 - x
    whole_kl = (k3(-0.5) + k3(0.4)) / 8
    moved = [torch.tensor([[-0.5, 0, 0], [0.4, 0, 0]]), torch.zeros(2, 3)]
    masks = [torch.tensor([[1.0, 0, 0], [1.0, 0, 0]]), torch.ones(2, 3)]
    for spec in (LossSpec(), LossSpec(advantages="dr_grpo", policy_loss="sequence",
                                      reduction="sequence")):
        sliced = sum(actor_loss(lp, torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3),
                                torch.ones(2, 3) * m, m, spec, 0.0, 3, tokens=torch.tensor(4.0)
                                )[1]["approx_kl"].item() / 2 for lp, m in zip(moved, masks))
        assert sliced == pytest.approx(whole_kl, rel=1e-5), spec.policy_loss
        assert whole_kl == pytest.approx(0.0248, abs=1e-4)
