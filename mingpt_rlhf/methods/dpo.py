"""Direct Preference Optimisation (Rafailov et al. 2023): RLHF without a reward model or sampling.

On a preference pair (chosen c, rejected r) for one prompt, with the policy's and the frozen
reference's log-probs summed over the response tokens:

    h    = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))
    loss = -log sigmoid(beta * h)            (DPO)
    loss = (h - 1 / (2 beta))^2              (IPO, Azar et al. 2023: beta plays tau)

`beta * (log pi(y) - log ref(y))` is the "implicit reward" of y: DPO fits it to the labels as
the RM fits its scores (train_rm.py), so the policy is its own reward model. At the start the
policy is the reference, h = 0 and the DPO loss is log 2.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..logprobs import lm_logprobs


def response_logprob_sums(model, ids, attention_mask, response_mask, suppress=None):
    """(B,) sum of log p(token) over the tokens where `response_mask` (B, T) is 1, each
    predicted from the position before it. Works for right- or left-padded rows (the model
    is padding-aware); the output layer runs on the response positions only."""
    hidden = model.trunk(ids, attention_mask)[:, :-1]          # position t predicts token t + 1
    used = response_mask[:, 1:].bool()                         # (B, T - 1)
    logp, _ = lm_logprobs(model, hidden[used], ids[:, 1:][used], suppress=suppress)
    rows = used.nonzero()[:, 0]
    return torch.zeros(len(ids), dtype=logp.dtype, device=logp.device).index_add(0, rows, logp)


def pair_losses(h: torch.Tensor, beta: float, loss: str = "sigmoid") -> torch.Tensor:
    """Each pair's loss from its h = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))."""
    if loss == "sigmoid":
        return -F.logsigmoid(beta * h)
    if loss == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    raise ValueError(f"unknown DPO loss {loss!r}")


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float = 0.1,
             loss: str = "sigmoid"):
    """Mean DPO (or IPO) loss over pairs from (B,) summed log-probs, and its diagnostics:
    reward_acc (implicit reward of chosen > rejected), margin (mean beta * h), and the mean
    implicit rewards of chosen and rejected."""
    chosen = policy_chosen - ref_chosen        # log-ratio of each side
    rejected = policy_rejected - ref_rejected
    h = chosen - rejected
    losses = pair_losses(h, beta, loss)
    with torch.no_grad():
        stats = {"reward_acc": (chosen > rejected).float().mean(),
                 "margin": (beta * h).mean(),
                 "chosen_reward": (beta * chosen).mean(),
                 "rejected_reward": (beta * rejected).mean()}
    return losses.mean(), stats
