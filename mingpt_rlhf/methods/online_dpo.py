"""Online DPO: DPO's loss on pairs the policy writes itself, ranked by the reward.

Offline DPO (methods/dpo.py, train_dpo.py) learns from a fixed file of pairs written by other
policies; the further the policy moves from them, the less they say about it, and it falls
short of PPO (docs/methods.md). Online DPO (Guo et al. 2024, "Direct language model alignment
from online AI feedback"; Calandriello et al. 2024) keeps DPO's loss and replaces the file:

1. for each prompt, sample a group of `group_size` responses from the current policy (2 by
   default), as GRPO does;
2. score them with the reward (a reward model, the task's check, a function, an
   environment's return) and take the best as chosen and the worst as rejected
   (`preference_signs`: +1 and -1, 0 for the others; a group whose scores are all equal has
   no preference: its pair is kept with signs 0 and counts for nothing, so that every process
   of a torchrun holds the same number of pairs, `pair_rows`);
3. one DPO step per minibatch of pairs against the frozen reference: h = (log pi(c) - log
   ref(c)) - (log pi(r) - log ref(r)) over each response's tokens, loss -log sigmoid(beta h),
   or IPO's (h - 1 / (2 beta))^2 (`pair_loss`, methods/dpo.py's `dpo_loss`).

The KL to the reference is DPO's beta, inside the loss: no KL penalty in the reward and no
critic. Its loss needs no ratio to the sampler, so a stale sampler (--sampler_lag) changes
which pairs it sees, not the loss: the reason Noukhovitch et al. ("Asynchronous RLHF", 2025)
found it the most robust to staleness. In the trainer it is one entry of two tables of
losses.py: the advantage estimator "preference" and the policy loss "dpo".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dpo import pair_losses


def preference_signs(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) +1 for the best response of each group (rows g*k .. g*k + k - 1), -1 for the
    worst, 0 for the rest (the first of equal scores wins a tie); a group of equal scores
    gets 0 everywhere (no preference to learn)."""
    g = scores.view(-1, group_size)                                    # (G, k)
    best = F.one_hot(g.argmax(-1), group_size)
    worst = F.one_hot(g.argmin(-1), group_size)
    differ = (g.max(-1).values != g.min(-1).values)[:, None]          # (G, 1)
    return ((best - worst) * differ).to(scores.dtype).flatten()


def row_signs(advantages, action_mask) -> torch.Tensor:
    """(B,) each row's sign, from advantages that carry it on every token (B, N)."""
    return (advantages * action_mask).sum(-1) / action_mask.sum(-1).clamp(min=1)


def pair_rows(signs: torch.Tensor, group_size: int) -> torch.Tensor:
    """Row indices [chosen_0, rejected_0, chosen_1, rejected_1, ...], one pair per group of
    the (B,) `signs` of `preference_signs`: the rows of the update. A group without a
    preference gives its first two rows (signs 0: `pair_loss` leaves the pair out)."""
    g = signs.view(-1, group_size)
    base = torch.arange(len(g), device=signs.device) * group_size
    tie = g.abs().sum(-1) == 0
    chosen = torch.where(tie, 0, g.argmax(-1))
    rejected = torch.where(tie, 1, g.argmin(-1))
    return torch.stack([base + chosen, base + rejected], -1).flatten()


def pair_loss(logprobs, ref_logprobs, advantages, action_mask, beta: float, loss: str,
              pairs=None):
    """The mean DPO (or IPO) loss over the pairs of a minibatch: rows 2i and 2i + 1 (in
    either order), each row's advantage its sign (+1 chosen, -1 rejected) on every token.
    With the signs, h of a pair is sum(sign x (log pi - log ref)) over its two rows. A pair
    with a sign 0 (a group of equal scores, never in training: `pair_rows` leaves them out)
    counts for nothing; a minibatch without a pair gives 0. logprobs etc.: (B, N), B even.
    `pairs`: what the mean divides by instead of the count of pairs with a preference (under
    torchrun, `distributed.tokens_per_rank` of them: the whole minibatch's mean)."""
    sign = row_signs(advantages, action_mask)                                      # (B,)
    logratio = ((logprobs - ref_logprobs) * action_mask).sum(-1)                  # (B,)
    assert len(sign) % 2 == 0, "online DPO's minibatches hold whole pairs"
    valid = (sign.view(-1, 2) != 0).all(-1).float()                                # (P,)
    h = (sign * logratio).view(-1, 2).sum(-1)                                      # (P,)
    return (valid * pair_losses(h, beta, loss)).sum() / (valid.sum().clamp(min=1) if pairs is None else pairs)


def preferred_pairs(advantages, action_mask) -> torch.Tensor:
    """(P,) 1 for each pair of rows (2i, 2i + 1) that carries a preference, else 0."""
    return (row_signs(advantages, action_mask).view(-1, 2) != 0).all(-1).float()


def learn_pairs(exp, group_size: int):
    """The rows of a rollout (ppo.Experience) online DPO learns from: one pair per group, its
    best and worst (`pair_rows`); the trainer keeps each pair whole in its minibatches."""
    return exp.select(pair_rows(row_signs(exp.advantages, exp.action_mask), group_size))
