"""Log-probabilities of the tokens a model wrote, at any vocabulary size, in little memory.

The output layer is applied here, only at the positions that score a token, in chunks of rows
whose (rows, V) float32 logits are reduced to one log-prob (and entropy) each and dropped,
recomputed in backward when there is more than one chunk (docs/speed.md, "Log-probs at a large
vocabulary"). `token_logprobs(logits, tokens)` is the plain version the tests compare with.

The logit at position t predicts the token at t + 1: callers pass `hidden[:, T-1:-1]` for the
response `sequences[:, T:]` (the classic off-by-one of RLHF; docs/details.md, item 1).
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 1 << 23  # logits per chunk: 8 M floats (32 MB), e.g. 166 rows at GPT-2's vocab


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool = False):
    """log p(tokens) from logits already aligned with them: (..., V) and (...) -> (...).
    With `with_entropy`, also the entropy at each position, from the same log-softmax."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    taken = logp.gather(-1, tokens[..., None]).squeeze(-1)
    if not with_entropy:
        return taken
    return taken, -(logp.exp() * logp).sum(-1)


def tempered_log_softmax(logits, temperature: float = 1.0, suppress: int | None = None):
    """log softmax(logits / temperature) (rows, V) of float32 logits, `suppress` (PAD) at 0: the
    one place it is written, as the sampler and the scoring passes must agree to the bit."""
    logits = logits / temperature  # (rows, V)
    if suppress is not None:
        # the id the policy never writes (PAD): probability exactly 0, as when sampling. The
        # most negative float, not -inf, keeps p * log p = 0 * finite = 0 in the entropy.
        logits[:, suppress] = torch.finfo(logits.dtype).min
    return torch.log_softmax(logits, dim=-1)


def tempered_logprobs(logits, tokens, temperature: float = 1.0, suppress: int | None = None,
                      entropy: str | None = None):
    """log p(tokens) (rows,) under `tempered_log_softmax`, and its entropy (rows,) or None."""
    logp = tempered_log_softmax(logits, temperature, suppress)
    taken = logp.gather(-1, tokens[:, None]).squeeze(-1)
    if entropy is None:
        return taken, None
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        ent = -(logp.exp() * logp).sum(-1)
    return taken, ent


def _chunk(model, hidden, tokens, temperature, suppress, entropy):
    """(rows,) log-probs and entropies (or None) of one chunk of (rows, C) hidden states."""
    return tempered_logprobs(model.logits(hidden), tokens, temperature, suppress, entropy)


def lm_logprobs(model, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                suppress: int | None = None, entropy: str | None = None,
                chunk_elements: int = CHUNK_ELEMENTS):
    """log p(tokens) under `model`'s output layer, from the hidden states that predict them.

    hidden: (..., C) float; tokens: (...) int64, the token each position predicts.
    temperature: the logits are divided by it (PPO's log-probs are those of the tempered
    distribution that sampled). suppress: an id given probability 0 (PAD).
    entropy: None, "value" (the entropy without its gradient) or "grad" (with it).
    Returns (log-probs (...), entropy (...) or None), float32.
    """
    shape = tokens.shape
    h = hidden.reshape(-1, hidden.size(-1))          # (M, C)
    t = tokens.reshape(-1)                           # (M,)
    rows = max(1, chunk_elements // model.config.vocab_size)
    if h.size(0) <= rows:  # one chunk: nothing to gain from recomputing it
        taken, ent = _chunk(model, h, t, temperature, suppress, entropy)
    else:  # a large vocabulary (GPT-2's)
        taken, ent = _in_chunks(model, h, t, temperature, suppress, entropy, rows)
    return taken.view(shape), (ent.view(shape) if ent is not None else None)


def _in_chunks(model, h, t, temperature, suppress, entropy, rows):
    """`_chunk` over `rows` rows of (M, C) hidden states at a time, each recomputed in
    backward when gradients are needed (docs/speed.md, "Log-probs at a large vocabulary")."""
    recompute = torch.is_grad_enabled() and h.requires_grad
    parts = []
    for i in range(0, h.size(0), rows):
        args = (model, h[i:i + rows], t[i:i + rows], temperature, suppress, entropy)
        parts.append(checkpoint(_chunk, *args, use_reentrant=False) if recompute
                     else _chunk(*args))
    taken = torch.cat([p[0] for p in parts])
    return taken, (torch.cat([p[1] for p in parts]) if entropy is not None else None)


def sequence_logprobs(model, sequences: torch.Tensor, attention_mask: torch.Tensor, start: int,
                      **kwargs):
    """log p of the tokens `sequences[:, start:]` (B, N) given everything before them, with one
    trunk pass; `kwargs` as `lm_logprobs`. Returns (log-probs (B, N), entropy or None)."""
    hidden = model.trunk(sequences, attention_mask)[:, start - 1:-1]  # (B, N, C): predicts start..
    return lm_logprobs(model, hidden, sequences[:, start:], **kwargs)


def input_mask(targets: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the real inputs of a right-padded LM batch, each row up to its last target
    (what comes after is padding; the trunk skips it, machinery/packing.py)."""
    T = targets.size(1)
    positions = torch.arange(T, device=targets.device)
    last = ((targets >= 0).long() * positions).argmax(-1, keepdim=True)  # (B, 1)
    return positions <= last


def lm_loss_of_hidden(model, hidden: torch.Tensor, targets: torch.Tensor,
                      suppress: int | None = None, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy from the trunk's (B, T, C) hidden states of an LM batch (see
    `lm_loss`). The output layer is applied to the positions with a target only."""
    keep = targets >= 0                       # (B, T) positions that predict a real target
    logp, _ = lm_logprobs(model, hidden[keep], targets[keep], suppress=suppress)  # (M,)
    return -(logp.mean() if reduction == "mean" else logp.sum())


def lm_loss(model, inputs: torch.Tensor, targets: torch.Tensor, suppress: int | None = None,
            reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (SFT, ptx, eval loss) from (B, T) inputs and targets, where
    targets[b, t] is the token at t + 1 or IGNORE (-100). reduction: "mean" over targets, or
    "sum"."""
    hidden = model.trunk(inputs, input_mask(targets))  # (B, T, C)
    return lm_loss_of_hidden(model, hidden, targets, suppress, reduction)
