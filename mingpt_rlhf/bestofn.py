"""Best-of-n sampling: the simplest use of a reward model, and the baseline RLHF must beat.

For each prompt, sample n responses from a policy, score each with the reward model, keep the
best. No training at all, but n times the generation cost at every use; PPO pays its cost
once, at training time, and then samples once per prompt.

Responses are scored exactly as PPO scores them (normalised RM score at the last real token,
a fixed penalty when the response never reached EOS), so best-of-n and PPO optimise the same
number.

    from mingpt_rlhf.bestofn import best_of_n
    texts, scores, tokens = best_of_n(policy, rm, tokenizer, prompts, n=16, max_new_tokens=32)
"""
from __future__ import annotations

import torch

from .evaluate import generate_batches, response_texts


@torch.no_grad()
def best_of_n(policy, reward_model, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
              temperature: float = 1.0, missing_eos_penalty: float = -1.0, generator=None,
              batch_size: int = 256):
    """(best response per prompt, its score, generated tokens per prompt on average)."""
    repeated = [p for p in prompts for _ in range(n)]  # n copies of each prompt, side by side
    texts, scores, n_tokens = [], [], 0
    for out in generate_batches(policy, tokenizer, repeated, max_new_tokens, batch_size,
                                temperature=temperature, generator=generator):
        s = reward_model(out.sequences, out.attention_mask).float()
        ended = ((out.sequences == tokenizer.eos_id) & out.action_mask.bool()).any(-1)
        scores.append(torch.where(ended, s, torch.full_like(s, missing_eos_penalty)).cpu())
        texts += response_texts(tokenizer, out)
        n_tokens += out.action_mask.sum().item()
    scores = torch.cat(scores).view(len(prompts), n)  # (P, n)
    best = scores.argmax(-1)
    chosen = [texts[i * n + j] for i, j in enumerate(best.tolist())]
    return chosen, scores.max(-1).values, n_tokens / len(prompts)
