"""Sample responses from a policy for a list of prompts, and measure them.

Used by every stage on held-out prompts: SFT and PPO report `well_formed` and `gold` (when the
task has a gold reward), PPO also `distinct2` (a collapse into repetition shows up here) and
the response length, and best-of-n (`methods/bestofn.py`) re-uses the sampler.

A response is decoded up to and including its EOS, so the text says whether it ended (the
built-in task's tokenizer writes EOS as "<eos>").
"""
from __future__ import annotations

import torch

from .data import encode_prompt, left_pad
from .sampling import generate


def decode_rows(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decode the tokens of each row of `ids` (B, T) where `mask` (B, T) is 1."""
    return [tokenizer.decode([t for t, m in zip(row, keep) if m])
            for row, keep in zip(ids.tolist(), mask.tolist())]


def response_texts(tokenizer, out) -> list[str]:
    """The generated tokens of each row of a GenerationOutput, decoded (EOS included)."""
    return decode_rows(tokenizer, out.sequences, out.action_mask)


@torch.no_grad()
def generate_batches(model, tokenizer, prompts: list[str], max_new_tokens: int,
                     batch_size: int = 64, **sampling):
    """Yield a GenerationOutput for each batch of `prompts`: encoded (cut from the left to
    leave room for `max_new_tokens`), left-padded, sampled with `sampling` (temperature,
    top_k, top_p, generator), stopping at the tokenizer's EOS."""
    device = next(model.parameters()).device
    max_prompt = model.config.block_size - max_new_tokens
    for i in range(0, len(prompts), batch_size):
        rows = [encode_prompt(tokenizer, p, max_prompt) for p in prompts[i:i + batch_size]]
        ids, mask = left_pad(rows, tokenizer.pad_id)
        yield generate(model, ids.to(device), mask.to(device), max_new_tokens=max_new_tokens,
                       eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id, **sampling)


def sample_responses(model, tokenizer, prompts: list[str], max_new_tokens: int,
                     temperature: float = 1.0, top_k=None, top_p=None, batch_size: int = 64,
                     generator=None) -> list[str]:
    """One sampled response per prompt, decoded."""
    return [text for out in generate_batches(model, tokenizer, prompts, max_new_tokens,
                                             batch_size, temperature=temperature, top_k=top_k,
                                             top_p=top_p, generator=generator)
            for text in response_texts(tokenizer, out)]


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Distinct n-grams / all n-grams over all texts (words): 1 = no repetition at all."""
    grams = [tuple(w[i:i + n]) for w in (t.split() for t in texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / max(1, len(grams))


def policy_report(task, prompts: list[str], responses: list[str]) -> dict:
    """Figures of a batch of responses: length, distinct2, and the task's gold/well_formed."""
    report = {"resp_len": sum(len(r.split()) for r in responses) / max(1, len(responses)),
              "distinct2": distinct_n(responses, 2)}
    if task is not None:
        golds = [task.gold_reward(p, r) for p, r in zip(prompts, responses)]
        report["gold"] = sum(golds) / len(golds)
        report["well_formed"] = sum(task.well_formed(p, r) for p, r in zip(prompts, responses)) / len(prompts)
    return report
