"""Best-of-n sampling: the simplest use of a reward model, and the baseline RLHF must beat.

For each prompt, sample n responses from a policy, score each with the reward model, keep the
best. No training at all, but n times the generation cost at every use; PPO pays its cost
once, at training time, and then samples once per prompt.

Responses are scored exactly as PPO scores them (normalised RM score at the last real token,
a fixed penalty when the response never reached EOS), so best-of-n and PPO optimise the same
number. The reward model may be an ensemble (`ensemble.RewardEnsemble`): the best response is
then the best by its combination rule (mean, wco, uwo), and WARM is a reward model like any.

    from mingpt_rlhf.methods.bestofn import best_of_n
    texts, scores, tokens = best_of_n(policy, rm, tokenizer, prompts, n=16, max_new_tokens=32)
"""
from __future__ import annotations

import math

import torch

from ..evaluate import generate_batches, response_texts


@torch.no_grad()
def best_of_n(policy, reward_model, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
              temperature: float = 1.0, missing_eos_penalty: float | None = -1.0, generator=None,
              batch_size: int = 256):
    """(best response per prompt, its score, generated tokens per prompt on average).
    `missing_eos_penalty=None` keeps a cut-off response's own score, as train_ppo.py's
    `--penalize_missing_eos false` does (a task whose responses have no EOS)."""
    repeated = [p for p in prompts for _ in range(n)]  # n copies of each prompt, side by side
    texts, scores, n_tokens = [], [], 0
    for out in generate_batches(policy, tokenizer, repeated, max_new_tokens, batch_size,
                                temperature=temperature, generator=generator):
        s = reward_model(out.sequences, out.attention_mask).float()
        ended = ((out.sequences == tokenizer.eos_id) & out.action_mask.bool()).any(-1)
        if missing_eos_penalty is not None:
            s = torch.where(ended, s, torch.full_like(s, missing_eos_penalty))
        scores.append(s.cpu())
        texts += response_texts(tokenizer, out)
        n_tokens += out.action_mask.sum().item()
    scores = torch.cat(scores).view(len(prompts), n)  # (P, n)
    best = scores.argmax(-1)
    chosen = [texts[i * n + j] for i, j in enumerate(best.tolist())]
    return chosen, scores.max(-1).values, n_tokens / len(prompts)


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n || policy) in nats, as Stiennon et al. and Gao et al. give it:
    log n - (n - 1) / n. Exact when no two samples ever tie on the reward; with ties it is an
    upper bound (`best_of_n_kl_exact`)."""
    return math.log(n) - (n - 1) / n


def best_of_n_kl_exact(probs: torch.Tensor, rewards: torch.Tensor, n: int) -> float:
    """The exact KL(best-of-n || policy) of a policy over finitely many outcomes, outcome i drawn
    with probability probs[i] and scored rewards[i]. Outcomes with equal rewards form one level;
    best-of-n lands on a level L with probability F(L)^n - F(L-)^n (F: the probability of
    scoring at most L's reward), spread over the level's outcomes in proportion to probs, so
    KL = sum over levels of q(L) log(q(L) / p(L))."""
    probs, rewards = probs.double(), rewards.double()
    levels = torch.unique(rewards)                                    # ascending
    p_level = torch.stack([probs[rewards == r].sum() for r in levels])
    below = torch.cumsum(p_level, 0)
    q_level = below ** n - torch.cat([below.new_zeros(1), below[:-1]]) ** n
    keep = q_level > 0
    return (q_level[keep] * torch.log(q_level[keep] / p_level[keep])).sum().item()


def best_of_n_weights(N: int, n: int) -> torch.Tensor:
    """(N,) float64: the chance that the i-th lowest of N scored samples (i = 1..N) is the
    highest of n drawn from them without replacement, C(i - 1, n - 1) / C(N, n). The weighted
    sum of the N samples' (sorted) figures is then the exact mean of best-of-n over every
    n-subset: one set of N samples measures best-of-n for every n <= N."""
    if not 1 <= n <= N:
        raise ValueError(f"need 1 <= n <= N, got n={n}, N={N}")
    total = math.comb(N, n)
    return torch.tensor([math.comb(i - 1, n - 1) / total for i in range(1, N + 1)],
                        dtype=torch.float64)
