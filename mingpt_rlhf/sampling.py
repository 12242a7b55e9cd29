"""Batched generation with a KV cache: temperature, top-k, top-p, EOS, left-padded prompts.

The prompt batch is left-padded, so every row's next token goes in the same column and one
forward pass per step serves the whole batch. The first pass runs the whole prompt and fills
the KV cache; each later pass feeds only the token just sampled.

Each row stops on its own when it samples EOS; from then on it receives padding (and is not
attended to), and the loop ends when every row has stopped or `max_new_tokens` is reached.

The returned masks are what PPO needs:
- `attention_mask` (B, T + new): 1 for every real token of prompt and response.
- `action_mask`    (B, T + new): 1 for every generated token up to and including EOS; the
  EOS is an action the policy took, so it is trained and rewarded like any other token.

PAD is never sampled: when `pad_token_id` is given and differs from EOS, its logit is set to
-inf before every draw (a sampled PAD would be scored by the reward model but dropped by
`decode`). Ids past the real vocabulary cannot be drawn either: the model returns logits for
`vocab_size` ids only. Only the last position's logits are computed at each step.

Note for RL: PPO must compute its log-probs from the same distribution it sampled from, so
rollouts use plain sampling (no top-k / top-p) and the log-probs are taken from
`logits / temperature`, with PAD excluded the same way (RLHF_NOTES.md, "negative KL").

Try it:  python -m mingpt_rlhf.sampling   (samples from a random tiny model)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import position_ids_from_mask


@dataclass
class GenerationOutput:
    sequences: torch.Tensor       # (B, T + new) prompt then response, int64
    attention_mask: torch.Tensor  # (B, T + new) 1 = real token (not padding)
    action_mask: torch.Tensor     # (B, T + new) 1 = generated token up to and including EOS
    prompt_len: int               # T: the response starts at this column

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


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token per row from the last-position logits (B, V). temperature 0 = greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    if top_k and top_k < logits.size(-1) and (top_p is None or top_p >= 1.0):
        # draw among the k best directly: softmax over their k logits is the same distribution
        # as filter_logits + softmax over the vocabulary, with fewer and smaller ops per token
        best, best_ids = torch.topk(logits, top_k, dim=-1)  # (B, k), (B, k)
        probs = torch.softmax(best / temperature, dim=-1)
        choice = torch.multinomial(probs, 1, generator=generator)  # (B, 1) index into the k
        return best_ids.gather(-1, choice).squeeze(-1)
    logits = filter_logits(logits / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(model, prompt_ids, attention_mask=None, max_new_tokens: int = 32,
             temperature: float = 1.0, top_k=None, top_p=None, eos_token_id=None,
             pad_token_id=None, generator=None) -> GenerationOutput:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt of `prompt_ids` (B, T).

    `pad_token_id` fills the positions after a row's EOS (default: `eos_token_id`, else 0);
    the masks, not the pad value, say what is real. A `pad_token_id` distinct from EOS is
    never sampled. `generator` makes sampling reproducible.
    """
    check_sampling_options(temperature, top_k, top_p)
    B, T = prompt_ids.shape
    if T == 0:
        raise ValueError("every prompt needs at least one token (GPT-2 users often start "
                         "an empty prompt with <|endoftext|>)")
    if T + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt of {T} tokens + {max_new_tokens} new tokens does not fit "
                         f"block_size {model.config.block_size}; shorten the prompt or "
                         f"lower max_new_tokens")
    # a PAD of its own is never a token the policy may write; a default PAD is EOS (or 0), a
    # real token, and stays allowed
    suppress = pad_token_id if pad_token_id is not None and pad_token_id != eos_token_id else None
    if pad_token_id is None:
        pad_token_id = eos_token_id if eos_token_id is not None else 0
    if attention_mask is None:
        attention_mask = torch.ones_like(prompt_ids)
    was_training = model.training
    model.eval()
    # inference mode skips autograd's bookkeeping on every small op of the decoding loop;
    # its tensors cannot enter autograd later, so the results are cloned out of it
    with torch.inference_mode():
        out = _sample(model, prompt_ids, attention_mask.long(), max_new_tokens, temperature,
                      top_k, top_p, eos_token_id, pad_token_id, suppress, generator)
    model.train(was_training)
    return GenerationOutput(*(x.clone() for x in out), T)


def next_token_logits(model, ids, attention_mask, position_ids, cache, suppress):
    """(B, V) logits of the last position only (at a 50k vocabulary, the other positions'
    logits would cost far more than the step itself), with the `suppress` id at -inf."""
    hidden = model.trunk(ids, attention_mask, position_ids, kv_cache=cache)[:, -1]  # (B, C)
    logits = model.logits(hidden)                                                # (B, V)
    if suppress is not None:
        logits[:, suppress] = float("-inf")
    return logits


def _sample(model, prompt_ids, attention_mask, max_new_tokens, temperature, top_k, top_p,
            eos_token_id, pad_token_id, suppress, generator):
    """The decoding loop of `generate`: (sequences, attention_mask, action_mask)."""
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
    # while no row has padding (none in the prompt, no row stopped yet) the model needs no
    # mask, which saves building one per step
    padded = not bool(attention_mask.all())

    logits = next_token_logits(model, prompt_ids, attention_mask,
                               position_ids_from_mask(attention_mask), cache, suppress)
    n_new = 0
    for t in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
        # the mask of this step's forward covers columns up to T + t: padded by the prompt, or
        # by rows that stopped before t (a row that stops now has its EOS there, a real token)
        mask_has_padding = padded
        if eos_token_id is not None:
            token = token.masked_fill(done, pad_token_id)  # a stopped row only gets padding
            full_mask[:, T + t] = (~done).long()
            done = done | (token == eos_token_id)
            n_done = int(done.sum())  # one sync answers both "all stopped?" and "any?"
            padded = padded or n_done > 0
        sequences[:, T + t] = token
        n_new = t + 1
        if eos_token_id is not None and n_done == B:
            break
        if t + 1 == max_new_tokens:
            break  # the last token needs no forward pass
        step_mask = full_mask[:, :T + t + 1] if mask_has_padding else None
        logits = next_token_logits(model, token[:, None], step_mask, positions[:, t:t + 1],
                                   cache, suppress)

    sequences = sequences[:, :T + n_new]
    full_mask = full_mask[:, :T + n_new]
    action_mask = full_mask.clone()
    action_mask[:, :T] = 0
    return sequences, full_mask, action_mask


if __name__ == "__main__":
    from .model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=32))
    prompts = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
    out = generate(m, prompts, torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), max_new_tokens=8,
                   eos_token_id=1, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    print(out.sequences, out.action_mask, sep="\n")
