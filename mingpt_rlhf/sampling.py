"""Batched generation with a KV cache: temperature, top-k, top-p, EOS, left-padded prompts.

The prompts are left-padded, so every row's next token goes in the same column: the first
pass runs the prompts and fills the cache, each later pass feeds only the token just drawn.
A row stops when it samples EOS and gets padding after it. The masks are PPO's:
`attention_mask` marks every real token, `action_mask` every generated one up to and
including EOS (an action like any other). PAD is never sampled. With `score=True` the sampler
keeps each drawn token's log-prob under the full tempered distribution, its entropy and the
hidden state that chose it, so PPO needs no second pass to learn what the sampling policy
thought of its own tokens (docs/details.md, items 16 and 17).

Try it:  python -m mingpt_rlhf.sampling   (samples from a random tiny model)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .logprobs import tempered_logprobs
from .model import position_ids_from_mask


@dataclass
class GenerationOutput:
    sequences: torch.Tensor       # (B, T + new) prompt then response, int64
    attention_mask: torch.Tensor  # (B, T + new) 1 = real token (not padding)
    action_mask: torch.Tensor     # (B, T + new) 1 = generated token up to and including EOS
    prompt_len: int               # T: the response starts at this column
    # with generate(score=True), for each generated token (0 past a row's EOS):
    logprobs: torch.Tensor | None = None  # (B, new) float32 log p under softmax(logits / temperature),
    #                                       PAD excluded: the full distribution, before top-k / top-p
    entropy: torch.Tensor | None = None   # (B, new) float32 entropy of that distribution
    hidden: torch.Tensor | None = None    # (B, new, C) the final hidden state that chose the token

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_len:]  # (B, new)


def check_sampling_options(temperature=1.0, top_k=None, top_p=None):
    """Raise ValueError for options that cannot describe a distribution."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None = off), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 or None = off), got {top_p}")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row from the last-position logits (B, V). temperature 0 = greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    if top_k or (top_p is not None and top_p < 1.0):
        return sample_filtered(logits, temperature, top_k, top_p, generator)
    return draw(torch.softmax(logits / temperature, dim=-1), generator)


def draw(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """One index per row of `probs` (B, V), drawn with its probabilities: (B,) int64.

    By inverting the cumulative distribution: one uniform number u per row in (0, 1], and the
    first index whose cumulative probability reaches u (`torch.multinomial` draws V numbers per
    row instead, slower at GPT-2's 50,257 ids). The running sum is in float64, so a token of
    probability 0 (PAD) can never be drawn. (Apple's MPS has no float64: there, multinomial.)"""
    if probs.device.type == "mps":
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    cdf = probs.double().cumsum(-1)                                          # (B, V)
    # a diverged model (NaN or inf logits) must stop the run, as multinomial did, not write
    # the last id forever; asserted on the device, so a GPU does not wait for the answer
    total = cdf[:, -1:]                                                      # (B, 1)
    torch._assert_async((torch.isfinite(total) & (total > 0)).all(),
                        "sampling from probabilities that are NaN, inf or all 0: the model's "
                        "logits are not finite (the run diverged; lower the learning rate)")
    u = 1.0 - torch.rand(len(probs), 1, dtype=torch.float64, device=probs.device,
                         generator=generator)                                # (B, 1) in (0, 1]
    index = torch.searchsorted(cdf, u * total)                               # first cdf >= u
    return index.squeeze(-1).clamp_(max=probs.size(-1) - 1)  # rounding can never pass the end


def sample_filtered(logits, temperature, top_k=None, top_p=None, generator=None):
    """`sample_next` with top-k and / or top-p: the draw among the k best / the nucleus.
    Off in RL by default: the log-probs are of the full distribution, the draws would not be
    (docs/details.md, item 17)."""
    if top_k and top_k < logits.size(-1) and (top_p is None or top_p >= 1.0):
        # draw among the k best directly: softmax over their k logits is the same distribution
        # as filter_logits + softmax over the vocabulary, with fewer and smaller ops per token
        best, best_ids = torch.topk(logits, top_k, dim=-1)  # (B, k), (B, k)
        choice = draw(torch.softmax(best / temperature, dim=-1), generator)  # (B,) index into the k
        return best_ids.gather(-1, choice[:, None]).squeeze(-1)
    logits = filter_logits(logits / temperature, top_k, top_p)
    return draw(torch.softmax(logits, dim=-1), generator)


def filter_logits(logits: torch.Tensor, top_k=None, top_p=None) -> torch.Tensor:
    """Set the logits of tokens outside the top-k / the nucleus to -inf. logits: (B, V)."""
    if top_k:
        kth_best = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already cover top_p of the mass;
        # the best token always stays (its preceding mass is 0)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def generate(model, prompt_ids, attention_mask=None, max_new_tokens: int = 32,
             temperature: float = 1.0, top_k=None, top_p=None, eos_token_id=None,
             pad_token_id=None, generator=None, score: bool = False, loop=None) -> GenerationOutput:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt of `prompt_ids` (B, T).
    `pad_token_id` (default: EOS, else 0) fills a row after its EOS. `score=True` also returns
    each token's log-prob, entropy, hidden state. `loop`: `_sample`, or decode_graphs'."""
    check_sampling_options(temperature, top_k, top_p)
    if score and temperature == 0:
        raise ValueError("score=True needs temperature > 0: greedy decoding has no log-probs")
    B, T = prompt_ids.shape
    if T == 0:
        raise ValueError("every prompt needs at least one token (GPT-2 users often start "
                         "an empty prompt with <|endoftext|>)")
    if T + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt of {T} tokens + {max_new_tokens} new tokens does not fit "
                         f"block_size {model.config.block_size}; shorten the prompt or "
                         f"lower max_new_tokens")
    # a PAD of its own is never written; a default PAD is EOS (or 0), a real token, allowed
    suppress = pad_token_id if pad_token_id is not None and pad_token_id != eos_token_id else None
    if pad_token_id is None:
        pad_token_id = eos_token_id if eos_token_id is not None else 0
    if attention_mask is None:
        attention_mask = torch.ones_like(prompt_ids)
    was_training = model.training
    model.eval()
    # no autograd bookkeeping in the loop; its tensors are cloned out to enter autograd later
    with torch.inference_mode():
        out = (loop or _sample)(model, prompt_ids, attention_mask.long(), max_new_tokens, temperature,
                                top_k, top_p, eos_token_id, pad_token_id, suppress, generator, score)
    model.train(was_training)
    sequences, full_mask, action_mask, scores = out
    scores = [x.clone() for x in scores] if score else [None, None, None]
    return GenerationOutput(sequences.clone(), full_mask.clone(), action_mask.clone(), T, *scores)


def next_token_logits(model, ids, attention_mask, position_ids, cache, suppress):
    """(B, V) logits of the last position only (at a 50k vocabulary, the other positions'
    logits would cost far more than the step itself), with the `suppress` id at -inf, and
    the (B, C) hidden state they came from."""
    hidden = model.trunk(ids, attention_mask, position_ids, kv_cache=cache)[:, -1]  # (B, C)
    logits = model.logits(hidden)                                                # (B, V)
    if suppress is not None:
        logits[:, suppress] = float("-inf")
    return logits, hidden


def _sample(model, prompt_ids, attention_mask, max_new_tokens, temperature, top_k, top_p,
            eos_token_id, pad_token_id, suppress, generator, score=False):
    """The decoding loop of `generate`: (sequences, attention_mask, action_mask, scores),
    scores = [logprobs, entropy, hidden] of the generated tokens with `score`, else []."""
    B, T = prompt_ids.shape
    device = prompt_ids.device
    cache = model.new_kv_cache(B, T + max_new_tokens)
    sequences = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=device)
    sequences[:, :T] = prompt_ids
    # without EOS every generated token is real, so the response part starts as ones
    full_mask = torch.ones(B, T + max_new_tokens, dtype=torch.long, device=device)
    full_mask[:, :T] = attention_mask
    done = torch.zeros(B, dtype=torch.bool, device=device)
    # positions count real tokens only, so left padding shifts nothing; computed once here
    prompt_lens = attention_mask.sum(-1, keepdim=True)                        # (B, 1)
    positions = prompt_lens + torch.arange(max_new_tokens, device=device)     # (B, new)
    # while no row has padding (in its prompt, or after its EOS) the model needs no mask
    padded = not bool(attention_mask.all())

    logits, hidden = next_token_logits(model, prompt_ids, attention_mask,
                                       position_ids_from_mask(attention_mask), cache, suppress)
    steps = []  # with `score`: (logprob, entropy, hidden) of each step's token
    n_new = 0
    for t in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
        # this step's mask covers columns up to T + t: padded if a row stopped before t
        mask_has_padding = padded
        if eos_token_id is not None:
            token = token.masked_fill(done, pad_token_id)  # a stopped row only gets padding
            full_mask[:, T + t] = (~done).long()
            done = done | (token == eos_token_id)
            n_done = int(done.sum())  # one sync answers both "all stopped?" and "any?"
            padded = padded or n_done > 0
        sequences[:, T + t] = token
        if score:  # the full tempered distribution's view of the token, as PPO scores it
            steps.append((*tempered_logprobs(logits, token, temperature, suppress, "value"), hidden))
        n_new = t + 1
        if eos_token_id is not None and n_done == B:
            break
        if t + 1 == max_new_tokens:
            break  # the last token needs no forward pass
        step_mask = full_mask[:, :T + t + 1] if mask_has_padding else None
        logits, hidden = next_token_logits(model, token[:, None], step_mask,
                                           positions[:, t:t + 1], cache, suppress)

    sequences = sequences[:, :T + n_new]
    full_mask = full_mask[:, :T + n_new]
    action_mask = full_mask.clone()
    action_mask[:, :T] = 0
    scores = []
    if score:  # (B, new), (B, new), (B, new, C); nothing counts past a row's EOS
        real = action_mask[:, T:].bool()
        if steps:
            logprobs, entropy, hiddens = (torch.stack(x, 1) for x in zip(*steps))
        else:  # max_new_tokens 0
            logprobs = entropy = torch.zeros(B, 0, device=device)
            hiddens = hidden.new_zeros(B, 0, hidden.size(-1))
        scores = [torch.where(real, logprobs, 0.0), torch.where(real, entropy, 0.0), hiddens]
    return sequences, full_mask, action_mask, scores


if __name__ == "__main__":
    from .model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=32))
    prompts = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
    out = generate(m, prompts, torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), max_new_tokens=8,
                   eos_token_id=1, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    print(out.sequences, out.action_mask, sep="\n")
