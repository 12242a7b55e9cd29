"""The entropy mechanism (Cui et al. 2025): Clip-Cov and KL-Cov, two policy losses.

Cui et al. find that a policy's entropy falls in one step by about the covariance, over the
tokens it samples, between a token's log-probability and its advantage: a confident token
(high log pi) with a positive advantage gets likelier still, and the entropy drops. Two forms
of one law: a step changes the entropy at a prefix by minus the covariance, under the policy,
of log pi(a) and the change of a's logit. The plain policy gradient of a softmax changes that
logit by lr x pi(a) x A: the covariance of log pi and pi x A (the form the exact check at the
end of this file tests). A natural-gradient step changes it by lr x A: the covariance of log
pi and A. Over tokens sampled from pi, each already counted as often as pi draws it, the
per-token covariance of log pi and A below estimates the second form, the one the losses use.
A few tokens of highest covariance carry most of that drop, so they act on those alone:

- **Clip-Cov**: among the tokens whose covariance lies in [low, high] and that PPO's clip has
  not clipped already, a share `cov_ratio` of the minibatch's tokens is chosen at random and
  learns nothing from the surrogate (its advantage set to 0 for this loss); the clip stays as
  PPO's.
- **KL-Cov**: the share `cov_ratio` of tokens of highest covariance is penalised by
  `kl_cov_coef` x |log pi - log pi_old|; every token's ratio term is left unclipped (the
  penalty takes the clip's place). At ratio 1 the penalty and its gradient are 0: it acts
  on the later minibatches and epochs of an update.

Each token's covariance is (log pi(y_t) - mean) x (A_t - mean), with log pi the policy
learning (no gradient) and the means over the minibatch's real tokens; under torchrun over
every process's tokens (gathered), so the choice does not depend on how the minibatch is
split. `--learn_batch_size` is refused with them: a slice does not see the rest of its
minibatch's current log-probs. The count chosen is exactly max(1, floor(cov_ratio x tokens))
(fewer only when fewer tokens qualify), ties broken by the token's place in the minibatch.
Cui et al.'s ratios (2e-4 and 2e-3) are for batches of millions of tokens; at this
project's minibatches of hundreds they would choose none, so the default share is 0.02.
KL-Cov's coefficient defaults to 0.1 where the authors' recipe passes 1: with ten times their
share of tokens (0.02 against 0.002), 0.1 keeps the penalty's weight per token of the
minibatch, coefficient x share, at theirs (0.002).

Clip-Cov's random choice is drawn from the data (a hash of each token's log-prob and
advantage), not from a generator, so that every process and the gradient oracle, which
maps the loss over every batch at once, make the same choice for the same minibatch.
"""
from __future__ import annotations

import torch

from ..machinery.distributed import all_sum, gather, is_distributed, rank
from ..ppo import policy_loss, reduce_tokens


def token_covariance(logprobs, advantages, action_mask):
    """(B, N) (log pi - mean) x (A - mean) per real token (0 elsewhere), the means over every
    process's real tokens of the minibatch; and the number of those tokens."""
    mask = action_mask.bool()
    lp = torch.where(mask, logprobs.detach().float(), 0.0)
    adv = torch.where(mask, advantages.float(), 0.0)
    sums = all_sum(torch.stack([lp.sum(), adv.sum(), mask.sum().float()]))
    count = sums[2].clamp(min=1)
    cov = (lp - sums[0] / count) * (adv - sums[1] / count)
    return torch.where(mask, cov, 0.0), sums[2]


def _largest(score, mask, k):
    """(B, N) 1 on exactly k masked entries of highest score (all of them when fewer than k),
    ties broken by the entry's place among the masked entries in row order: earlier first.
    Every process's entries are ranked together (gathered in rank order, which keeps the
    minibatch's row order), so the choice is the same however torchrun splits the rows. Written
    with sorts (no index that depends on k) so that it maps under vmap."""
    flat = torch.where(mask, score, float("-inf")).flatten()
    offset = 0
    if is_distributed():
        parts = gather(flat.cpu())
        offset = sum(len(x) for x in parts[:rank()])
        flat_all = torch.cat([x.to(flat.device) for x in parts])
    else:
        flat_all = flat
    order = flat_all.sort(descending=True, stable=True).indices  # ties: the earlier first
    place = order.argsort()  # each entry's place in that order (0 = highest)
    chosen = place[offset:offset + flat.numel()].view_as(score) < k
    return (chosen & mask).to(score.dtype)


def chosen_count(count, share: float):
    return torch.clamp(torch.floor(count * share), min=1).long()


def clip_cov_tokens(logprobs, advantages, action_mask, share: float, low: float, high: float,
                    clipped=None):
    """(B, N) 1 on the tokens Clip-Cov takes out: `share` of the tokens, drawn among those of
    covariance in [low, high] (fewer when fewer lie there) that PPO's clip has not already
    clipped (`clipped` (B, N) bool: their surrogate has no gradient left to take out, and the
    authors' code leaves them out of the draw too)."""
    cov, count = token_covariance(logprobs, advantages, action_mask)
    band = action_mask.bool() & (cov >= low) & (cov <= high)
    if clipped is not None:
        band = band & ~clipped
    # a token's draw depends on its own log-prob and advantage only, not on where it sits in
    # the minibatch nor on the means (whose last bits depend on how the sums were split), so
    # every split of the minibatch (processes) draws alike
    lp, adv = logprobs.detach().float(), advantages.float()
    draw = torch.frac(torch.sin(lp * 78.233 + adv * 12.9898) * 43758.5453).abs()
    return _largest(draw, band, chosen_count(count, share))  # all of the band if it is smaller


def kl_cov_tokens(logprobs, advantages, action_mask, share: float):
    """(B, N) 1 on the `share` of tokens of highest covariance, which KL-Cov penalises."""
    cov, count = token_covariance(logprobs, advantages, action_mask)
    return _largest(cov, action_mask.bool(), chosen_count(count, share))


# the two entries of losses.POLICY_LOSSES, with that table's signature (ref_logprobs unused)
def clip_cov_loss(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget,
                  tokens):
    """PPO's clipped surrogate with Clip-Cov's chosen tokens learning nothing from it."""
    with torch.no_grad():  # the tokens whose clipped branch is taken (ppo.policy_loss's max)
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = (-advantages * ratio.clamp(1 - spec.clip_range, 1 + spec.clip_high)
                   > -advantages * ratio)
    out = clip_cov_tokens(logprobs, advantages, action_mask, spec.cov_ratio, spec.clip_cov_low,
                          spec.clip_cov_high, clipped)
    return policy_loss(logprobs, old_logprobs, advantages * (1 - out), action_mask,
                       spec.clip_range, spec.reduction, budget, tokens, clip_high=spec.clip_high)


def kl_cov_loss(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget,
                tokens):
    """-A x ratio on every token, plus kl_cov_coef x |log pi - log pi_old| on KL-Cov's chosen
    tokens; nothing is clipped (clipfrac 0)."""
    chosen = kl_cov_tokens(logprobs, advantages, action_mask, spec.cov_ratio)
    log_ratio = logprobs - old_logprobs
    per_token = -advantages * torch.exp(log_ratio) + spec.kl_cov_coef * chosen * log_ratio.abs()
    loss = reduce_tokens(per_token, action_mask, spec.reduction, budget, tokens)
    return loss, torch.zeros((), device=loss.device)


# ----------------------------------------------------------------------------- the law, exactly
# In the enumerable world (lab/tabular.py) one step's entropy change can be computed exactly
# and set against the covariance that Cui et al. say drives it. For a softmax at one prefix s,
# a change dz of its logits changes its entropy by -Cov_{a ~ pi_s}(log pi_s(a), dz_a) to first
# order; with the exact policy gradient, dz_a = lr x d(s) pi_s(a) A(s, a) (d(s): the chance to
# reach s), which is their covariance of log pi and pi x A (a natural-gradient step, dz_a =
# lr x A(s, a), would give the covariance with A: the module docstring). The token entropy a
# run logs is a visit-weighted mean over prefixes, whose weights move too; their formula leaves
# that out.

def prefix_entropies(table):
    """(P,) the entropy of the next-token distribution at each prefix, and (P,) the chance of
    reaching each prefix."""
    from .tabular import conditionals, visits
    cond = conditionals(table)[:, 1:]
    return -(cond.exp() * cond).sum(-1), visits(table)


def token_entropy(table, weights=None):
    """The mean entropy per token the policy writes: each prefix's entropy weighed by the
    chance of reaching it (or by `weights`, held fixed)."""
    h, d = prefix_entropies(table)
    w = d if weights is None else weights
    return (w * h).sum() / w.sum()


def covariance_prediction(table, update, lr: float):
    """-lr x sum_s w_s Cov_{a ~ pi_s}(log pi_s(a), update_s(a)), w_s the visit weights: the
    first-order change of the token entropy along `update` with the visits held fixed."""
    from .tabular import conditionals
    cond = conditionals(table)[:, 1:]
    pi = cond.exp()
    u = update[:, 1:]
    cov = (pi * cond * u).sum(-1) - (pi * cond).sum(-1) * (pi * u).sum(-1)
    _, d = prefix_entropies(table)
    return -lr * (d * cov).sum() / d.sum()


def advantages_of_tokens(table, reward):
    """(P, V) A(s, a) = Q(s, a) - V(s) of every prefix and next token under the table's policy
    for a reward at the end of each response (PAD's column 0)."""
    from .tabular import PREFIX_INDEX, RESPONSES, conditionals, response_logprobs
    prob = response_logprobs(table).exp()
    cond = conditionals(table).exp()
    q = torch.zeros_like(table)
    for s, prefix in enumerate(PREFIX_INDEX):
        for a in range(1, table.size(1)):
            through = [i for i, y in enumerate(RESPONSES) if y[:len(prefix) + 1] == (*prefix, a)]
            if through:
                mass = prob[through]
                q[s, a] = (mass * reward[through]).sum() / mass.sum()
    value = (cond[:, 1:] * q[:, 1:]).sum(-1, keepdim=True)
    adv = q - value
    adv[:, 0] = 0.0
    return adv
