"""Decoding with fixed shapes, captured once as a CUDA graph and replayed for each token.

sampling.py's loop is the clear way to decode, and on a GPU a slow one: each new token runs a
few hundred small kernels (GPT-2 small: 214), each launched by the CPU, and the GPU spends most
of a step waiting for the next launch (docs/speed.md, "On one GPU"). A CUDA graph records the
kernels of one step once and replays them all with one launch. A replay runs the same kernels
on the same memory, so nothing may change shape or move from one token to the next. That is
the step here (`FixedStep`), a decoding loop for `sampling.generate(..., loop=DecodeGraphs())`:

- the KV cache is one buffer of fixed length (`FixedKVCache`), and each step attends over all
  of it with a mask of the columns filled so far and the prompts' padding (sampling.py attends
  over the filled columns only);
- the column of the latest token and each row's position are tensors that the step moves on
  itself; rotary positions are looked up in a table made once, not computed from the host;
- the token drawn, the EOS bookkeeping and, with `score=True`, its log-prob, entropy and
  hidden state are written in place into buffers that outlive the call;
- whether every row has ended is asked every CHECK_EVERY tokens (each question makes the CPU
  wait for the GPU), not after every token: a batch may run up to CHECK_EVERY - 1 steps past
  its last EOS, which write padding and are cut off, so the output is sampling.py's.

A graph is captured per batch size and length bucket (prompt + new tokens, rounded up to
BUCKET) the first time a step of that size runs, and again whenever what it reads has moved.
It reads the weights where they were at capture: an optimizer step or a lagging sampler's swap
(lab/offpolicy.py) writes them in place and the replay sees the new values, but a cast that
makes a new tensor (runtime.hold_frozen_in) or a load does not, and neither does switching
LoRA's adapters off (a Python flag): `what_a_graph_reads` notes all that at capture, and a
change means a new capture. Autocast's cache of cast weights is off while capturing, so each
replay casts the weights as they are then.

The same tokens as sampling.py's loop: the prompt pass is the same, and so is every step's
arithmetic, except that attention sums over the longer, masked buffer: the masked columns add
exact zeros, but the sums are blocked differently, so a logit may move in its last bits
(~1e-6 in float32). A draw that falls within that of the boundary between two tokens, or two
greedy logits that close, can then go the other way. Under bf16 autocast the same difference
is one of bf16's rounding steps inside attention, and a log-prob moves by ~1e-2 (the tests'
tiny models), so draws part more often; PPO does not reuse a bf16 sampler's log-probs anyway
(the actor is scored in a pass of its own, ppo_trainer.py). The random numbers are those
sampling.py draws, one `draw` per token from the caller's generator (on a GPU, a generator
the graph owns, set from the caller's before and copied back after); the steps past the last
EOS draw a few more, so the caller's generator ends elsewhere than after sampling.py's loop.
tests/test_decode_graphs.py compares the two; on the CPU the step runs without a graph.

Try it:  python -m mingpt_rlhf.decode_graphs
"""
from __future__ import annotations

import time

import torch

from .logprobs import tempered_logprobs
from .model import KVCache, position_ids_from_mask, rotary_tables
from .sampling import _sample, next_token_logits, sample_next
from .machinery.lora import LoRALinear
from .machinery.runtime import cuda_matmul_switch

CHECK_EVERY = 8  # tokens between two checks that every row has ended (one host sync each)
BUCKET = 64      # buffer lengths are multiples of this: one graph serves prompts of many widths


class FixedKVCache(KVCache):
    """A KVCache whose decoding steps write at `column`, a (1,) tensor, and return the whole
    buffer (2, B, nkv, S, hs). With `column` None (the prompt pass) it is KVCache."""

    def __init__(self, kv: torch.Tensor):
        self.kv, self.length, self.column = kv, 0, None  # kv: (L, 2, B, nkv, S, hs)

    def update(self, layer: int, kv: torch.Tensor) -> torch.Tensor:
        if self.column is None:
            return super().update(layer, kv)
        layer_kv = self.kv[layer]
        # kv: (2, B, nkv, 1, hs) into its column, in the cache's dtype as KVCache stores it
        # (under autocast Qwen3's normed keys come out float32, the values bf16)
        layer_kv.index_copy_(3, self.column, kv.to(layer_kv.dtype))
        return layer_kv


def what_a_graph_reads(model) -> tuple:
    """What a captured step depends on beyond its own buffers: where each weight lives and in
    what dtype and layout, which LoRA adapters are on, the output layer's function (runtime's
    TF32 one replaces it), autocast and the switch of CUDA's float32 matmuls (TF32 or not)."""
    return (tuple((p.data_ptr(), p.dtype, p.shape, p.stride()) for p in model.parameters()),
            tuple(m.enabled for m in model.modules() if isinstance(m, LoRALinear)),
            getattr(model.logits, "__func__", model.logits),
            torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
            cuda_matmul_switch()[2])


def autocast_without_cache():
    """The caller's CUDA autocast (on or off, its dtype) with its cache of cast weights off:
    a cached cast made before the capture would be read by every replay, stale once the
    weights change (torch's CUDA graph notes ask for this)."""
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                          enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)


class FixedStep:
    """The buffers of one batch size and buffer length, the decoding step that reads and
    writes them, and its CUDA graph once captured. `options` are the sampling options of
    `sampling._sample`, fixed for the step's life: (temperature, top_k, top_p, eos_token_id,
    pad_token_id, suppress, score)."""

    def __init__(self, model, rows: int, length: int, max_new_tokens: int, options, device):
        self.model, self.max_new_tokens = model, max_new_tokens
        self.temperature, self.top_k, self.top_p, self.eos, self.pad, self.suppress, self.score = options
        # zeros, not torch.empty: a masked column has weight 0, and 0 x NaN would still be NaN
        self.cache = FixedKVCache(model.new_kv_cache(rows, length).kv.zero_())
        self.tokens = torch.zeros(rows, length, dtype=torch.long, device=device)  # the sequences
        self.filled = torch.ones(rows, length, dtype=torch.long, device=device)   # real tokens
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # of the latest token
        self.step = torch.zeros(1, dtype=torch.long, device=device)    # its index in the response
        self.prompt_lens = torch.zeros(rows, dtype=torch.long, device=device)
        self.columns = torch.arange(length, device=device)
        self.rope = None
        if model.config.rope_theta is not None:  # cos and sin of every position, (block, hs) each
            cos, sin = rotary_tables(torch.arange(model.config.block_size, device=device)[None],
                                     model.config)
            self.rope = (cos[0, 0], sin[0, 0])
        self.scores = None  # with `score`: logprobs, entropy (B, new), hidden states (B, new, C)
        self.graph, self.reads = None, None

    def begin(self, prompt_ids, attention_mask):
        """The prompt pass, as sampling.py's, into the buffer; the state of a new batch.
        Returns the (B, V) logits and (B, C) hidden state that draw the first token."""
        T = prompt_ids.size(1)
        self.tokens[:, :T] = prompt_ids
        self.filled.fill_(1)  # as sampling.py: a generated token is real until its row ends
        self.filled[:, :T] = attention_mask
        self.done.zero_()
        self.column.fill_(T - 1)
        self.step.fill_(-1)
        self.prompt_lens.copy_(attention_mask.sum(-1))
        self.cache.column, self.cache.length = None, 0
        logits, hidden = next_token_logits(self.model, prompt_ids, attention_mask,
                                           position_ids_from_mask(attention_mask), self.cache,
                                           self.suppress)
        self.cache.column = self.column
        if self.score and self.scores is None:
            rows, new = len(prompt_ids), self.max_new_tokens
            self.scores = (torch.zeros(rows, new, device=hidden.device),
                           torch.zeros(rows, new, device=hidden.device),
                           hidden.new_zeros(rows, new, hidden.size(-1)))
        return logits, hidden

    def record(self, logits, hidden, generator):
        """Draw the next token from (B, V) logits and write it, its mask and (with `score`)
        its scores into the next column: sampling.py's loop body, on tensors."""
        self.column += 1
        self.step += 1
        token = sample_next(logits, self.temperature, self.top_k, self.top_p, generator)  # (B,)
        if self.eos is not None:
            token = token.masked_fill(self.done, self.pad)  # a stopped row only gets padding
            self.filled.index_copy_(1, self.column, (~self.done).long()[:, None])
            self.done |= token == self.eos
        self.tokens.index_copy_(1, self.column, token[:, None])
        if self.score:  # the full tempered distribution's view of the token, as PPO scores it
            logprob, entropy = tempered_logprobs(logits, token, self.temperature, self.suppress,
                                                 "value")
            for buffer, value in zip(self.scores, (logprob, entropy, hidden)):
                buffer.index_copy_(1, self.step, value[:, None])

    def forward(self, generator):
        """One decoding step of fixed shapes: the latest token through the model, attending
        over the whole buffer, then `record` of the next one. What the graph holds."""
        model = self.model
        token = self.tokens.index_select(1, self.column)                  # (B, 1)
        positions = (self.prompt_lens + self.step)[:, None]               # (B, 1) real tokens before
        # columns filled so far (and real), and its own column, as sampling.py's masks
        seen = (self.filled.bool() & (self.columns <= self.column)) | (self.columns == self.column)
        x = model.transformer.wte(token)                                  # (B, 1, C)
        rope = None
        if self.rope is None:
            x = x + model.transformer.wpe(positions)
        else:  # GPT.blocks computes the tables from the positions on the host's side: looked up
            rope = (self.rope[0][positions][:, None], self.rope[1][positions][:, None])  # (B, 1, 1, hs)
        for block in model.transformer.h:  # GPT.blocks in eval mode, with this mask and cache
            x = block(x, seen[:, None, None, :], self.cache, rope)
        hidden = model.transformer.ln_f(x)[:, -1]                         # (B, C)
        logits = model.logits(hidden)                                     # (B, V)
        if self.suppress is not None:
            logits[:, self.suppress] = float("-inf")
        self.record(logits, hidden, generator)

    def capture(self, generator, pool) -> float:
        """Run one step eagerly on a side stream (it warms up what a capture cannot start:
        cuBLAS's workspaces, lazy kernels), then capture the next one. Returns its seconds."""
        start = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), autocast_without_cache():
            self.forward(generator)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(generator)  # replays draw from its stream
        with torch.cuda.graph(self.graph, pool=pool), autocast_without_cache():
            self.forward(generator)  # recorded, not run
        torch.cuda.synchronize()
        return time.perf_counter() - start


class DecodeGraphs:
    """A decoding loop for `sampling.generate(..., loop=DecodeGraphs())`: `sampling._sample`'s
    signature and results, with fixed-shape steps (`FixedStep`) that on CUDA are captured as
    graphs and replayed (`capture=False`: run eagerly; on a CPU they always are).

    It keeps the buffers and graphs of each batch size and length it has seen, the KV cache of
    a batch among them, until `clear()`; `captures` lists each capture and its seconds."""

    def __init__(self, capture: bool = True):
        self.capture = capture
        self.steps: dict[tuple, FixedStep] = {}
        self.captures: list[dict] = []  # {"rows", "length", "seconds"} per capture
        self.pool = None       # one memory pool for every graph: they never run at once, and
        self.generator = None  # no tensor made in a replay outlives it; the graphs' generator

    def clear(self) -> None:
        """Drop every buffer and graph (their memory returns to torch's allocator)."""
        self.steps.clear()

    def __call__(self, model, prompt_ids, attention_mask, max_new_tokens, temperature, top_k,
                 top_p, eos_token_id, pad_token_id, suppress, generator, score=False):
        if max_new_tokens < 2:  # no step to replay: the prompt pass draws the only token
            return _sample(model, prompt_ids, attention_mask, max_new_tokens, temperature, top_k,
                           top_p, eos_token_id, pad_token_id, suppress, generator, score)
        B, T = prompt_ids.shape
        device = prompt_ids.device
        length = -(-(T + max_new_tokens) // BUCKET) * BUCKET
        options = (temperature, top_k, top_p, eos_token_id, pad_token_id, suppress, score)
        key = (id(model), B, length, max_new_tokens, options, device,
               torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        if key not in self.steps:
            self.steps[key] = FixedStep(model, B, length, max_new_tokens, options, device)
        step = self.steps[key]
        graphed = self.capture and device.type == "cuda"
        if graphed:
            # replays draw from a generator of the graphs' own, set to the caller's state here
            # and copied back at the end: the caller's stream, whichever generator it passes
            source = generator if generator is not None else torch.cuda.default_generators[
                device.index if device.index is not None else torch.cuda.current_device()]
            if self.generator is None:
                self.generator = torch.Generator(device=device)
            self.generator.set_state(source.get_state())
            generator = self.generator
            reads = what_a_graph_reads(model)
            if step.reads != reads:
                step.graph, step.reads = None, reads  # captured again at the first step
        logits, hidden = step.begin(prompt_ids, attention_mask)
        step.record(logits, hidden, generator)
        sampled = 1
        while sampled < max_new_tokens:
            if eos_token_id is not None and sampled % CHECK_EVERY == 0 and bool(step.done.all()):
                break
            if step.graph is not None:
                step.graph.replay()
            elif graphed:
                self.pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
                seconds = step.capture(generator, self.pool)
                self.captures.append({"rows": B, "length": length, "seconds": round(seconds, 4)})
            else:
                step.forward(generator)
            sampled += 1
        if graphed:
            source.set_state(generator.get_state())
        # the response's columns up to the last one where a row was still writing (sampling.py
        # stops there); with EOS, a row's column is 1 until it has ended
        n_new = sampled if eos_token_id is None else int(step.filled[:, T:T + sampled].any(0).sum())
        sequences, full_mask = step.tokens[:, :T + n_new], step.filled[:, :T + n_new]
        action_mask = full_mask.clone()
        action_mask[:, :T] = 0
        scores = []
        if score:  # (B, new), (B, new), (B, new, C); nothing counts past a row's EOS
            real = action_mask[:, T:].bool()
            logprobs, entropy, hiddens = (x[:, :n_new] for x in step.scores)
            scores = [torch.where(real, logprobs, 0.0), torch.where(real, entropy, 0.0), hiddens]
        return sequences, full_mask, action_mask, scores


if __name__ == "__main__":
    from .model import GPT, GPTConfig
    from .sampling import generate
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=32))
    prompts, mask = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]]), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    for loop in (None, DecodeGraphs()):
        out = generate(m, prompts, mask, max_new_tokens=8, eos_token_id=1, pad_token_id=0,
                       generator=torch.Generator().manual_seed(0), loop=loop)
        print(type(loop).__name__, out.sequences.tolist())
