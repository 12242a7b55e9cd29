"""Clip-Cov and KL-Cov (lab/entropy.py) against values computed by hand."""
import torch

from mingpt_rlhf.lab.entropy import (clip_cov_loss, clip_cov_tokens, kl_cov_loss, kl_cov_tokens,
                                     token_covariance)
from mingpt_rlhf.losses import LossSpec
from mingpt_rlhf.ppo import policy_loss

# two responses: 3 and 2 real tokens
LP = torch.tensor([[-0.1, -2.0, -0.5], [-3.0, -0.2, 0.0]])
ADV = torch.tensor([[2.0, 1.0, -1.0], [1.0, 3.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_the_covariance_by_hand():
    # means over the 5 real tokens: log-prob -5.8 / 5 = -1.16, advantage 6 / 5 = 1.2
    cov, count = token_covariance(LP, ADV, MASK)
    expected = torch.tensor([[(-0.1 + 1.16) * (2.0 - 1.2), (-2.0 + 1.16) * (1.0 - 1.2),
                              (-0.5 + 1.16) * (-1.0 - 1.2)],
                             [(-3.0 + 1.16) * (1.0 - 1.2), (-0.2 + 1.16) * (3.0 - 1.2), 0.0]])
    torch.testing.assert_close(cov, expected)
    assert count == 5


def test_kl_cov_chooses_the_highest_covariances():
    # covariances: 0.848, 0.168, -1.452, 0.368, 1.728: the highest is row 1's second token,
    # then row 0's first; a share of 0.2 of 5 tokens is 1, of 0.4 is 2, of 0.01 still 1
    one = torch.tensor([[0.0, 0, 0], [0, 1, 0]])
    two = torch.tensor([[1.0, 0, 0], [0, 1, 0]])
    assert torch.equal(kl_cov_tokens(LP, ADV, MASK, 0.2), one)
    assert torch.equal(kl_cov_tokens(LP, ADV, MASK, 0.4), two)
    assert torch.equal(kl_cov_tokens(LP, ADV, MASK, 0.01), one)


def test_clip_cov_draws_only_inside_its_band():
    # band [0.3, 1.0] holds 0.848 and 0.368: one of them at a share of 0.2, both at 0.8
    band = torch.tensor([[1.0, 0, 0], [1, 0, 0]])
    chosen = clip_cov_tokens(LP, ADV, MASK, 0.2, 0.3, 1.0)
    assert chosen.sum() == 1 and (chosen <= band).all()
    assert torch.equal(clip_cov_tokens(LP, ADV, MASK, 0.8, 0.3, 1.0), band)
    assert clip_cov_tokens(LP, ADV, MASK, 0.8, 5.0, 6.0).sum() == 0  # an empty band


def test_kl_cov_loss_by_hand():
    """Unclipped -A x ratio on every token, plus coef x |log ratio| on the chosen one (row 1's
    second token), a token mean over the 5 real tokens."""
    spec = LossSpec(reduction="token", cov_ratio=0.2, kl_cov_coef=0.5)
    old = LP - torch.tensor([[0.3, -0.2, 0.0], [0.1, 0.4, 0.0]])      # log ratios
    loss, clipfrac = kl_cov_loss(LP, old, None, ADV, MASK, spec, 3, None)
    ratios = [[0.3, -0.2, 0.0], [0.1, 0.4]]
    terms = [-a * torch.tensor(r).exp() for a, r in zip([2.0, 1.0, -1.0, 1.0, 3.0],
                                                        ratios[0] + ratios[1])]
    expected = (sum(terms) + 0.5 * 0.4) / 5
    torch.testing.assert_close(loss, expected)
    assert clipfrac == 0


def test_at_ratio_1_kl_cov_has_the_plain_policy_gradient():
    """|log ratio| is 0 with gradient 0 at ratio 1: the first minibatch's gradient is the
    unclipped surrogate's alone."""
    spec = LossSpec(reduction="token", cov_ratio=0.4, kl_cov_coef=10.0)
    x = LP.clone().requires_grad_(True)
    kl_cov_loss(x, LP, None, ADV, MASK, spec, 3, None)[0].backward()
    y = LP.clone().requires_grad_(True)
    policy_loss(y, LP, ADV, MASK, 0.2, "token")[0].backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_clip_cov_takes_the_chosen_tokens_out_of_the_surrogate():
    """The chosen tokens get no gradient; the others get PPO's, the token mean still counting
    every real token."""
    spec = LossSpec(reduction="token", cov_ratio=0.8, clip_cov_low=0.3, clip_cov_high=1.0)
    old = LP - 0.05
    x = LP.clone().requires_grad_(True)
    clip_cov_loss(x, old, None, ADV, MASK, spec, 3, None)[0].backward()
    y = LP.clone().requires_grad_(True)
    policy_loss(y, old, ADV, MASK, 0.2, "token")[0].backward()
    chosen = torch.tensor([[1.0, 0, 0], [1, 0, 0]])
    assert (x.grad[chosen.bool()] == 0).all()
    torch.testing.assert_close(x.grad[~chosen.bool()], y.grad[~chosen.bool()])


def test_ties_at_the_threshold_choose_exactly_k_the_earlier_first():
    """Eight tokens of equal covariance (every log-prob alike): a share of 0.25 is 2 tokens, and
    the two are the first real tokens in row order, not every tied one."""
    lp = torch.full((2, 5), -1.0)
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0], [5.0, 6.0, 7.0, 8.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
    chosen = kl_cov_tokens(lp, adv, mask, 0.25)
    assert torch.equal(chosen, torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]))
    # Clip-Cov's draw ties too where two tokens share their log-prob and advantage
    lp2, adv2 = torch.full((2, 4), -1.0), torch.full((2, 4), 2.0)
    adv2[1] = -2.0  # every log-prob at its mean: covariance 0, in the band; each row's draws tie
    drawn = clip_cov_tokens(lp2, adv2, torch.ones(2, 4), 0.25, -1.0, 1.0)
    assert drawn.sum() == 2, drawn


def test_clip_cov_leaves_tokens_the_clip_already_clipped_out_of_its_draw():
    """A token whose ratio has passed the clip on its advantage's side has no surrogate gradient
    to take out: Clip-Cov draws among the others. The band [0.3, 1] holds row 0's first token
    and row 1's first, and a share of 0.2 takes one; row 1's wins the draw, but it is clipped
    (A 1 > 0, ratio e^0.5 > 1.2), so row 0's is taken out instead."""
    spec = LossSpec(reduction="token", cov_ratio=0.2, clip_cov_low=0.3, clip_cov_high=1.0)
    old = LP - torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    assert torch.equal(clip_cov_tokens(LP, ADV, MASK, 0.2, 0.3, 1.0),  # the draw, no clip known
                       torch.tensor([[0.0, 0, 0], [1, 0, 0]]))
    x = LP.clone().requires_grad_(True)
    clip_cov_loss(x, old, None, ADV, MASK, spec, 3, None)[0].backward()
    y = LP.clone().requires_grad_(True)
    policy_loss(y, old, ADV, MASK, 0.2, "token")[0].backward()
    assert y.grad[0, 0] != 0 and y.grad[1, 0] == 0  # PPO's: the clipped token has none
    assert x.grad[0, 0] == 0  # Clip-Cov took row 0's first token out
    keep = torch.ones_like(MASK, dtype=torch.bool)
    keep[0, 0] = False
    torch.testing.assert_close(x.grad[keep], y.grad[keep])
