"""The PPO math against hand computations and plain references (ppo.py)."""
import math

import pytest
import torch

from mingpt_rlhf.ppo import (AdaptiveKLController, Experience, ReplayBuffer, align_and_cat,
                             gae, kl_shaped_rewards, masked_whiten,
                             approx_kl, policy_loss, token_logprobs, value_loss)


def reference_gae(rewards, values, lengths, gamma, lam):
    """Row by row, straight from the definition, over the real tokens only."""
    out = torch.zeros_like(rewards)
    for b, n in enumerate(lengths):
        for t in range(n):
            adv = 0.0
            for k in range(t, n):
                v_next = values[b, k + 1].item() if k + 1 < n else 0.0
                delta = rewards[b, k].item() + gamma * v_next - values[b, k].item()
                adv += (gamma * lam) ** (k - t) * delta
            out[b, t] = adv
    return out


def test_gae_equals_reference_with_masks_and_lengths():
    torch.manual_seed(0)
    lengths = [5, 2, 7, 1]
    mask = torch.zeros(4, 7)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    rewards, values = torch.randn(4, 7), torch.randn(4, 7)
    for gamma, lam in [(1.0, 0.95), (0.9, 0.8)]:
        adv, ret = gae(rewards, values, mask, gamma, lam)
        expected = reference_gae(rewards, values, lengths, gamma, lam)
        torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret, (expected + values) * mask, atol=1e-5, rtol=1e-5)
        assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


def test_gae_with_lam_1_gives_discounted_returns():
    torch.manual_seed(1)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    rewards, values = torch.randn(2, 4), torch.randn(2, 4)
    gamma = 0.9
    _, ret = gae(rewards, values, mask, gamma, lam=1.0)
    for b, n in enumerate([3, 4]):
        for t in range(n):
            expected = sum(gamma ** (k - t) * rewards[b, k].item() for k in range(t, n))
            assert ret[b, t].item() == pytest.approx(expected, abs=1e-5)


def test_score_on_last_real_token_and_nothing_after_eos():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    logprobs = torch.tensor([[-1.0, -2, -1, 0, 0], [-1, -1, -1, -1, -1]])
    ref = torch.tensor([[-1.5, -1, -1, 0, 0], [-1, -2, -1, -1, -1]])
    rewards = kl_shaped_rewards(torch.tensor([3.0, -2.0]), logprobs, ref, mask, kl_coef=0.1)
    expected = torch.tensor([[-0.05, 0.1, 3.0, 0, 0], [0, -0.1, 0, 0, -2.0]])
    torch.testing.assert_close(rewards, expected)
    adv, ret = gae(rewards, torch.randn(2, 5), mask)
    assert (adv[0, 3:] == 0).all() and (ret[0, 3:] == 0).all()


def test_the_trainer_shapes_its_rewards_with_kl_shaped_rewards(monkeypatch):
    """One implementation of the reward PPO sees: training calls ppo.kl_shaped_rewards (with
    the run's KL estimator), so a change to it reaches the trainer. k2 by hand on the first
    row above: 0.5 x (-0.5)^2 = 0.125 and 0.5 x 1^2 = 0.5, times -0.1, plus the score."""
    from mingpt_rlhf import losses
    from mingpt_rlhf.losses import KL_ESTIMATORS, LossSpec, experience_advantages
    mask = torch.tensor([[1.0, 1, 1, 0, 0]])
    logprobs, ref = torch.tensor([[-1.0, -2, -1, 0, 0]]), torch.tensor([[-1.5, -1, -1, 0, 0]])
    k2 = kl_shaped_rewards(torch.tensor([3.0]), logprobs, ref, mask, 0.1, KL_ESTIMATORS["k2"])
    torch.testing.assert_close(k2, torch.tensor([[-0.0125, -0.05, 3.0, 0, 0]]))
    calls = []
    monkeypatch.setattr(losses, "kl_shaped_rewards",
                        lambda *a: calls.append(a) or torch.full_like(a[0], 7.0))
    placed = torch.tensor([[0.0, 0, 3.0, 0, 0]])
    rewards, _, _ = experience_advantages(placed, logprobs, ref, torch.zeros(1, 5), mask,
                                          LossSpec(kl_estimator="k2"), 0.1)
    assert len(calls) == 1 and calls[0][-1] is KL_ESTIMATORS["k2"] and (rewards == 7.0).all()


def test_whitening_over_real_tokens_only():
    x = torch.tensor([[1.0, 2, 3, 100], [4, 5, 6, 7]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    w = masked_whiten(x, mask)
    real = w[mask.bool()]
    assert real.mean().item() == pytest.approx(0, abs=1e-6)
    assert real.pow(2).mean().item() == pytest.approx(1, abs=1e-5)
    assert w[0, 3] == 0
    # a constant input (zero std) stays finite
    assert torch.isfinite(masked_whiten(torch.ones(2, 3), torch.ones(2, 3))).all()


def test_policy_loss_hand_computed_with_clipped_branches():
    old = torch.zeros(1, 4)
    # ratios e^0.5 = 1.65, e^-0.5 = 0.61, e^0.1 = 1.105, e^0.5
    new = torch.tensor([[0.5, -0.5, 0.1, 0.5]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, clipfrac = policy_loss(new, old, adv, mask, clip_range=0.2)
    r = [math.exp(0.5), math.exp(-0.5), math.exp(0.1), math.exp(0.5)]
    # A>0, ratio>1+eps: clipped at 1.2 (no gradient); A>0, ratio<1-eps: unclipped -A*r
    # A<0, ratio inside: -A*r; A<0, ratio>1+eps: unclipped -A*r is the max
    per_token = [-1.2, -r[1], 2 * r[2], r[3]]
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert clipfrac.item() == pytest.approx(0.25)
    expected_kl = sum((ri - 1) - math.log(ri) for ri in r) / 4
    assert approx_kl(new, old, mask).item() == pytest.approx(expected_kl, rel=1e-6)
    loss.backward()
    assert new.grad[0, 0] == 0  # the clipped branch passes no gradient
    assert all(new.grad[0, i] != 0 for i in (1, 2, 3))


def test_value_loss_hand_computed_with_clipped_branches():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    new = torch.tensor([[0.5, 0.1, -0.5]], requires_grad=True)
    ret = torch.tensor([[1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    loss = value_loss(new, old, ret, mask, clip_range=0.2)
    # token 0: unclipped (0.5-1)^2=0.25, clipped (0.2-1)^2=0.64 -> 0.64 (no grad)
    # token 1: inside the clip range -> (0.1-1)^2 = 0.81
    # token 2: unclipped 0.25, clipped (-0.2)^2=0.04 -> 0.25 (grad flows)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 0.25) / 3, rel=1e-6)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0 and new.grad[0, 2] != 0


def test_losses_ignore_masked_positions():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    a = policy_loss(torch.tensor([[0.1, 0.2, 5.0]]), torch.zeros(1, 3), torch.ones(1, 3), mask)[0]
    b = policy_loss(torch.tensor([[0.1, 0.2, -9.0]]), torch.zeros(1, 3), torch.ones(1, 3), mask)[0]
    assert a.item() == b.item()


def test_token_logprobs_shift_matches_a_per_token_loop():
    torch.manual_seed(0)
    V, T, N = 11, 3, 4
    seq = torch.randint(0, V, (2, T + N))
    logits = torch.randn(2, T + N, V)  # logits[:, t] predicts seq[:, t + 1]
    got = token_logprobs(logits[:, T - 1:-1], seq[:, T:])
    for b in range(2):
        for i in range(N):
            t = T + i
            expected = torch.log_softmax(logits[b, t - 1], -1)[seq[b, t]]
            assert got[b, i].item() == pytest.approx(expected.item(), abs=1e-6)


def test_logprobs_with_entropy_match_the_separate_definitions():
    torch.manual_seed(2)
    logits, tokens = torch.randn(3, 5, 11) * 3, torch.randint(0, 11, (3, 5))
    lp, ent = token_logprobs(logits, tokens, with_entropy=True)
    torch.testing.assert_close(lp, token_logprobs(logits, tokens))
    torch.testing.assert_close(ent, -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1))


def test_entropy_is_non_negative_and_max_for_uniform():
    torch.manual_seed(0)
    tokens = torch.zeros(8, 5, dtype=torch.long)
    ent = token_logprobs(torch.randn(8, 5, 13) * 5, tokens, with_entropy=True)[1]
    assert (ent >= 0).all()
    uniform = token_logprobs(torch.zeros(1, 1, 13), tokens[:1, :1], with_entropy=True)[1]
    assert uniform.item() == pytest.approx(math.log(13))


def test_adaptive_kl_matches_formula():
    """log beta += clip(log(KL / target), -0.2, 1) / horizon (horizon in iterations)."""
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10)
    ctl.update(9.0)      # log 1.5 = 0.405, inside the clip
    assert ctl.value == pytest.approx(0.1 * 1.5 ** 0.1)
    before = ctl.value
    ctl.update(3.0)      # log 0.5 = -0.69 -> clipped to -0.2
    assert ctl.value == pytest.approx(before * math.exp(-0.02))


def _experience(B, T, N, offset=0.0):
    f = lambda *shape: torch.arange(B * math.prod(shape[1:]), dtype=torch.float).view(*shape) + offset
    return Experience(torch.ones(B, T + N, dtype=torch.long), torch.ones(B, T + N, dtype=torch.long),
                      torch.ones(B, N), f(B, N), f(B, N), f(B, N), f(B, N), f(B, N), f(B, N),
                      torch.arange(B, dtype=torch.float) + offset)


def test_replay_buffer_yields_every_item_once_per_epoch():
    buf = ReplayBuffer(pad_id=0)
    buf.add(_experience(6, 3, 4))
    buf.add(_experience(5, 2, 6, offset=100))  # other prompt and response widths
    assert len(buf) == 11
    g = torch.Generator().manual_seed(0)
    orders = []
    for _ in range(3):
        seen = torch.cat([mb.scores for mb in buf.minibatches(4, g)])
        assert sorted(seen.tolist()) == sorted(list(range(6)) + [100.0 + i for i in range(5)])
        orders.append(seen.tolist())
    assert orders[0] != orders[1]  # reshuffled every epoch
    buf.clear()
    assert len(buf) == 0


def test_align_and_cat_keeps_responses_in_one_column():
    a, b = _experience(2, 3, 4), _experience(2, 5, 2)
    a.sequences[:, 3:] = 7  # responses
    b.sequences[:, 5:] = 8
    both = align_and_cat([a, b], pad_id=0)
    assert both.prompt_len == 5 and both.action_mask.shape == (4, 4)
    assert (both.sequences[:2, 5:] == 7).all() and (both.sequences[2:, 5:7] == 8).all()
    assert (both.attention_mask[:2, :2] == 0).all() and (both.action_mask[2:, 2:] == 0).all()


def test_trimmed_drops_only_all_padding_columns():
    a, b = _experience(2, 3, 4), _experience(2, 5, 2)
    both = align_and_cat([a, b], pad_id=0)  # (4, 5 + 4): rows of b have 2 response pads
    rows_b = both.select(torch.tensor([2, 3]))
    t = rows_b.trimmed()
    assert t.prompt_len == 5 and t.action_mask.shape == (2, 2)
    assert torch.equal(t.sequences, b.sequences) and torch.equal(t.logprobs, b.logprobs)
    rows_a = both.select(torch.tensor([0, 1])).trimmed()  # 2 prompt pad columns dropped
    assert rows_a.prompt_len == 3 and torch.equal(rows_a.sequences, a.sequences)
    full = both.trimmed()
    assert torch.equal(full.sequences, both.sequences)
