"""GRPO, Dr. GRPO and RLOO: advantages and losses against hand computations, then learning."""
import math
from dataclasses import replace

import pytest
import torch

from mingpt_rlhf.methods.critic_free import (group_advantages, k3_kl, leave_one_out_advantages,
                                             zero_group_fraction)
from mingpt_rlhf.losses import spec_of
from mingpt_rlhf.ppo import policy_loss, reduce_tokens


def test_grpo_advantages_equal_a_hand_computation():
    # group 1: rewards 1, 2, 3, 6: mean 3, unbiased std sqrt((4 + 1 + 0 + 9) / 3) = sqrt(14/3)
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(r, 4)  # eps 1e-4
    std = math.sqrt(14 / 3) + 1e-4
    assert adv[:4].tolist() == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std], abs=1e-6)
    assert adv[4:].tolist() == [0.0] * 4  # equal rewards: zero advantage, not NaN
    dr = group_advantages(r, 4, normalise_std=False)
    assert dr[:4].tolist() == pytest.approx([-2.0, -1.0, 0.0, 3.0])


def test_dr_grpo_scaling_is_the_group_std():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0])
    std = r.std().item()
    torch.testing.assert_close(group_advantages(r, 4, normalise_std=False),
                               group_advantages(r, 4) * (std + 1e-4))


@pytest.mark.parametrize("rewards", [[0.0] * 4, [1e-9, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
def test_grpo_advantages_are_never_nan(rewards):
    adv = group_advantages(torch.tensor(rewards), 4)
    assert torch.isfinite(adv).all() and adv.abs().max() < 1e-4


def test_rloo_baseline_excludes_the_sample_itself():
    r = torch.tensor([1.0, 2.0, 4.0, 9.0])
    # sample 0: baseline (2 + 4 + 9) / 3 = 5 -> -4; sample 3: (1 + 2 + 4) / 3 -> 9 - 7/3
    assert leave_one_out_advantages(r, 4).tolist() == pytest.approx(
        [1 - 5, 2 - 14 / 3, 4 - 4, 9 - 7 / 3])
    # = k / (k - 1) (r_i - mean)
    torch.testing.assert_close(leave_one_out_advantages(r, 4), 4 / 3 * (r - r.mean()))


def test_groups_must_divide_the_batch():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError):
        leave_one_out_advantages(torch.zeros(4), 1)


def test_zero_group_fraction():
    r = torch.tensor([1.0, 1.0, 2.0, 3.0, 0.0, 0.0])
    assert zero_group_fraction(r, 2) == pytest.approx(2 / 3)


def test_k3_kl_is_zero_for_identical_policies_and_nonnegative():
    lp = torch.randn(4, 7)
    assert k3_kl(lp, lp).abs().max().item() == 0.0
    other = lp + torch.randn(4, 7)
    assert (k3_kl(lp, other) >= 0).all()
    # hand value: d = ref - logp = log 2 -> 2 - log 2 - 1
    assert k3_kl(torch.tensor([0.0]), torch.tensor([math.log(2)])).item() == pytest.approx(1 - math.log(2))


def test_k3_kl_mean_estimates_the_kl():
    """Samples from p: mean of k3 with d = log q - log p approaches KL(p || q)."""
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    x = torch.multinomial(p, 200000, replacement=True, generator=torch.Generator().manual_seed(0))
    est = k3_kl(p.log()[x], q.log()[x]).mean().item()
    assert est == pytest.approx((p * (p / q).log()).sum().item(), rel=0.02)


def test_reductions_weigh_tokens_as_documented():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert reduce_tokens(x, mask, "token").item() == pytest.approx(8 / 5)
    assert reduce_tokens(x, mask, "sequence").item() == pytest.approx((1 + 4) / 2)
    assert reduce_tokens(x, mask, "budget", budget=8).item() == pytest.approx((4 / 8 + 4 / 8) / 2)


def test_grpo_sequence_mean_favours_long_wrong_and_short_right_responses():
    """Liu et al. 2025: with the per-response mean, a token of a long response gets a smaller
    gradient than one of a short response: a negative advantage is diluted over a long wrong
    answer. The budget reduction gives every token the same weight."""
    lp = torch.zeros(2, 8, requires_grad=True)
    mask = torch.tensor([[1.0] * 8, [1.0, 1.0] + [0.0] * 6])  # long, short
    adv = torch.tensor([[-1.0] * 8, [-1.0] * 8])               # both wrong
    loss, _ = policy_loss(lp, lp.detach(), adv * mask, mask, 0.2, "sequence")
    loss.backward()
    g = lp.grad.clone()
    assert g[0, 0] == pytest.approx(g[1, 0] / 4)  # 1/8 per token vs 1/2: the long one is spared
    lp.grad = None
    loss, _ = policy_loss(lp, lp.detach(), adv * mask, mask, 0.2, "budget", budget=8)
    loss.backward()
    assert lp.grad[0, 0] == pytest.approx(lp.grad[1, 0].item())


# ----------------------------------------------------------------------------- in the trainer
from test_ppo_trainer import Cfg, make_trainer, prompts  # noqa: E402


def grouped_prompts(n_prompts, k, seed=1):
    ids, mask = prompts(n_prompts, seed=seed)
    return ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)


@pytest.mark.parametrize("algo,kl_in", [("grpo", "loss"), ("grpo", "reward"), ("rloo", "reward")])
def test_first_minibatch_has_ratio_one_and_no_kl_loss(algo, kl_in):
    tr = make_trainer(Cfg(algo=algo, group_size=4, kl_in=kl_in), critic_free=True)
    exp, stats = tr.make_experience(*grouped_prompts(4, 4), torch.Generator().manual_seed(0))
    # float32: the actor's log-probs are the sampler's, the reference's a full pass: equal to rounding
    assert abs(stats["kl"]) < 1e-5
    assert stats["zero_groups"] == zero_group_fraction(exp.scores, 4)  # the scores' ties, before the KL
    # every token of a response carries its response's advantage
    adv = exp.advantages
    per_resp = adv.sum(-1) / exp.action_mask.sum(-1)
    torch.testing.assert_close(adv, per_resp[:, None] * exp.action_mask)
    tr.buffer.add(exp)
    out = tr.learn(torch.Generator().manual_seed(1))
    assert out["minibatch_steps"] > 0
    assert ("kl_loss" in out) == (kl_in == "loss")  # logged only with the KL in the loss


def test_a_group_must_be_one_prompt_k_times():
    tr = make_trainer(Cfg(algo="grpo", group_size=4), critic_free=True)
    ids, mask = prompts(16, seed=1)  # 16 different prompts, not 4 x 4
    with pytest.raises(AssertionError, match="share its prompt"):
        tr.make_experience(ids, mask, torch.Generator().manual_seed(0))
    # an eval batch is not grouped and needs no advantages
    exp, _ = tr.make_experience(ids, mask, torch.Generator().manual_seed(0), for_update=False)
    assert (exp.advantages == 0).all()


def test_grpo_kl_loss_is_k3_of_the_new_policy_against_the_reference():
    tr = make_trainer(Cfg(algo="grpo", group_size=4, ppo_epochs=2, kl_in="loss"), critic_free=True)
    g = torch.Generator().manual_seed(0)
    tr.step([grouped_prompts(4, 4)], g, torch.Generator().manual_seed(1))  # moves the policy
    exp, stats = tr.make_experience(*grouped_prompts(4, 4, seed=2), g)
    assert stats["kl"] > 0
    tr.buffer.add(exp)
    out = tr.learn(torch.Generator().manual_seed(1))
    assert out["kl_loss"] > 0


@pytest.mark.parametrize("algo,norm,kl_in", [("grpo", "grpo", "loss"), ("grpo", "dr", "loss"),
                                             ("grpo", "dr", "reward"), ("rloo", "grpo", "reward")])
def test_critic_free_methods_raise_a_trivial_reward(algo, norm, kl_in):
    """+1 per occurrence of token 5 (as the PPO learning test): 16 prompts x 4 samples."""
    tr = make_trainer(Cfg(algo=algo, group_size=4, grpo_norm=norm, kl_in=kl_in, max_new_tokens=8,
                          minibatch_size=16), critic_free=True)
    g = torch.Generator().manual_seed(0)
    batch = grouped_prompts(16, 4)
    rewards = []
    for _ in range(12):
        _, stats = tr.step([batch], g)
        rewards.append(stats["rm_score"])
    assert rewards[-1] > rewards[0] + 1.0, rewards


# ----------------------------------------------------------------------------- GRPO's std and the KL
def test_the_std_normalisation_with_the_kl_in_the_reward_is_refused():
    """In a group whose scores tie, rewards = score - beta x KL differ by KL noise only; the
    group's std would scale that noise to advantages of +-1. The std goes with the KL in the
    loss (auto picks it); asking for the KL in the reward is refused."""
    from mingpt_rlhf.ppo_trainer import resolve_auto_options
    with pytest.raises(ValueError, match="--kl_in loss"):
        make_trainer(Cfg(algo="grpo", group_size=4, grpo_norm="grpo", kl_in="reward"), critic_free=True)
    assert resolve_auto_options(Cfg(algo="grpo", grpo_norm="grpo", kl_in="auto")).kl_in == "loss"
    assert resolve_auto_options(Cfg(algo="grpo", grpo_norm="dr", kl_in="auto")).kl_in == "reward"
    assert resolve_auto_options(Cfg(algo="rloo", grpo_norm="grpo", kl_in="auto")).kl_in == "reward"


def test_a_group_of_equal_scores_gets_zero_advantage_with_the_std_and_the_kl_in_the_loss():
    """The case that made the pairing matter: every answer scores the same, the KLs differ.
    With the KL in the loss the group's advantages are exactly 0 (and it counts in
    zero_groups); Dr. GRPO with the KL in the reward gives it the KL penalty's own small
    advantages, -beta x (KL_i - mean KL), not a +-1 rescaling of them."""
    def constant(sequences, attention_mask, action_mask, **fields):
        return torch.full((len(sequences),), 0.5)
    ids, mask = grouped_prompts(2, 4)
    # every response scores 0.5, ended or not
    tr = make_trainer(Cfg(algo="grpo", group_size=4, grpo_norm="grpo", kl_in="auto",
                          missing_eos_penalty=0.5), critic_free=True)
    tr.reward_fn = constant
    tr.step([grouped_prompts(2, 4, seed=3)], torch.Generator().manual_seed(0),
            torch.Generator().manual_seed(1))  # moves the policy off the reference: KLs differ
    exp, stats = tr.make_experience(ids, mask, torch.Generator().manual_seed(2))
    assert (exp.ref_logprobs != exp.logprobs).any() and stats["zero_groups"] == 1.0
    assert (exp.advantages == 0).all()
    tr.cfg = replace(tr.cfg, grpo_norm="dr", kl_in="reward")  # k1, the reward's default
    tr.spec = spec_of(tr.cfg)
    exp, _ = tr.make_experience(ids, mask, torch.Generator().manual_seed(2))
    kl = ((exp.logprobs - exp.ref_logprobs) * exp.action_mask).sum(-1).view(-1, 4)
    expected = -tr.kl_ctl.value * (kl - kl.mean(-1, keepdim=True))
    per_resp = (exp.advantages.sum(-1) / exp.action_mask.sum(-1)).view(-1, 4)
    torch.testing.assert_close(per_resp, expected)
    assert per_resp.abs().max() < 0.1  # small, as the KL penalty is: nothing scaled it up
