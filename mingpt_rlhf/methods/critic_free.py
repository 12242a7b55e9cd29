"""Critic-free policy gradients: the baseline comes from the other responses to the same prompt.

GRPO (Shao et al. 2024) and RLOO (Ahmadian et al. 2024) sample a group of k responses per
prompt and score each one once (an outcome reward per response, no per-token values).
Rows of a rollout batch come in groups: rows g*k .. g*k + k - 1 answer the same prompt.

- GRPO:     A_i = (r_i - mean(r)) / (std(r) + eps)   (the group's mean and std)
- Dr. GRPO: A_i =  r_i - mean(r)                      (Liu et al. 2025: no std division)
- RLOO:     A_i =  r_i - mean(r_j, j != i) = k / (k - 1) * (r_i - mean(r))

Every token of response i gets A_i. A group whose rewards are all equal gets A = 0: no
signal, not a bug (`zero_group_fraction` logs how often).

With the KL in the loss (GRPO's choice) the penalty is per token with the k3 estimator
`exp(ref - logp) - (ref - logp) - 1`: >= 0, 0 when the policies agree, and its expected value
under the policy is KL(pi || ref). Its gradient is not KL's own: it follows the forward
KL(ref || pi) of each token (docs/gradients.md), which is one reason our PPO keeps the KL in
the reward instead (`--kl_in reward`). Every estimator and placement: losses.py.
"""
from __future__ import annotations

import torch


def grouped(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B / k, k): one row per prompt, in float32 at least (float64 stays float64:
    the gradient oracle, lab/gradients.py, computes in it)."""
    if group_size < 2 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} responses do not split into groups of {group_size} (>= 2)")
    scores = scores if scores.dtype == torch.float64 else scores.float()
    return scores.view(-1, group_size)


def group_advantages(scores: torch.Tensor, group_size: int, normalise_std: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """(B,) GRPO advantages: reward minus its group's mean, divided by the group's (unbiased)
    std + eps if `normalise_std` (GRPO) or not (Dr. GRPO)."""
    g = grouped(scores, group_size)
    adv = g - g.mean(-1, keepdim=True)
    if normalise_std:
        adv = adv / (g.std(-1, keepdim=True) + eps)
    return adv.reshape(-1)


def leave_one_out_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) RLOO advantages: each reward minus the mean of the other k - 1 of its group."""
    g = grouped(scores, group_size)
    others = (g.sum(-1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(-1)


def zero_group_fraction(scores: torch.Tensor, group_size: int) -> float:
    """Share of the groups whose rewards are all equal (they teach nothing)."""
    g = grouped(scores, group_size)
    return (g.max(-1).values == g.min(-1).values).float().mean().item()


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: e^d - d - 1, d = ref - logp."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1
