"""Model FLOPs of what a run computes, counted where its models compute it.

A forward pass costs 2 FLOPs per parameter per position it processes (a multiply and an add
per weight), its backward pass 4 (the gradients of the inputs and of the weights, 2 each):
6 per parameter per trained position, the rule of Kaplan et al. (2020). `FlopCounter` wraps
the three places where this project's models multiply by their weights, so it counts the
positions the code really passes, not a formula of them:

- `GPT.blocks` (the blocks and ln_f): 2 x their parameters per position given, the (B, T)
  ids of a pass or the real tokens the trunk packed (machinery/packing.py). The embeddings
  are looked up, not multiplied: not counted.
- `GPT.logits` (the output layer): 2 x V_padded x C per row given. Sampling asks for one row
  per sequence per step; scoring and learning for the response positions only.
- `ScalarHead.forward` (a reward model's, critic's or value head's): 2 x (C + 1) per row.

Sampling with the KV cache passes the prompt once, then one new position per sequence per
step, for every sequence until the last one ends; a scoring or learning pass passes whole
sequences. A pass under autograd (`torch.is_grad_enabled()`) of a model with trainable
weights adds its backward, 4 x per position: every such pass in the trainers ends in one.

Left out, as the 2N rule leaves them out: attention's own products (QK^T and AV, 4 x T x C
FLOPs per position and layer at a context of T, about T / 6C of the block's count: 5 % at 40
tokens and a width of 128), the softmaxes, norms' arithmetic beyond their weights, the
optimizer. A pass recomputed in backward (--grad_checkpoint; the output layer in chunks at a
50k vocabulary) is counted once more, forward and backward.

    with FlopCounter() as counter:
        counter.name(policy, "student")
        ...                                   # any passes
    counter.flops   # {"train": {"student": 1.2e12, ...}, "eval": {...}}

Each pass lands in the counter's current `phase` ("train" unless `in_phase` says otherwise)
under the name given to its model (`default` for a model never named).
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from mingpt_rlhf.heads import ScalarHead
from mingpt_rlhf.model import GPT

LOOKED_UP = ("transformer.wte.", "transformer.wpe.", "lm_head.")  # not the blocks' weights


def block_parameters(gpt: GPT) -> int:
    """The parameters `GPT.blocks` multiplies by at each position: every one but the
    embedding tables and the output layer (counted apart, where it is applied)."""
    return sum(p.numel() for n, p in gpt.named_parameters() if not n.startswith(LOOKED_UP))


class FlopCounter:
    """Counts model FLOPs per phase and per model while it is entered (module docstring)."""

    def __init__(self, default: str = "unnamed"):
        self.default = default
        self.phase = "train"
        self.flops: dict[str, dict[str, float]] = {}
        self.names = weakref.WeakKeyDictionary()   # module -> (name, trains)
        self.sizes = weakref.WeakKeyDictionary()   # GPT -> block_parameters
        self.originals = None

    def name(self, model, label: str) -> None:
        """Count `model`'s passes under `label`: a GPT, a reward model or critic (its `gpt`
        and its `head`) or a ScalarHead. Whether it trains (its backward counted) is read
        now: whether any of its weights requires a gradient."""
        trains = any(p.requires_grad for p in model.parameters())
        for part in (model, getattr(model, "gpt", None), getattr(model, "head", None)):
            if part is not None:
                self.names[part] = (label, trains)

    @contextlib.contextmanager
    def in_phase(self, phase: str):
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def add(self, module, positions: int, parameters: int) -> None:
        label, trains = self.names.get(module, (None, None))
        if label is None:
            label = self.default
            trains = any(p.requires_grad for p in module.parameters())
        per_position = 2 + (4 if trains and torch.is_grad_enabled() else 0)
        bucket = self.flops.setdefault(self.phase, {})
        bucket[label] = bucket.get(label, 0.0) + float(per_position * parameters * positions)

    def total(self, phase: str = "train") -> float:
        return sum(self.flops.get(phase, {}).values())

    def state(self) -> dict:
        return {phase: dict(models) for phase, models in self.flops.items()}

    def load(self, state: dict) -> None:
        """Go on from counts saved earlier (`state()`), as a resumed run goes on."""
        self.flops = {phase: dict(models) for phase, models in state.items()}

    def __enter__(self):
        assert self.originals is None, "a FlopCounter is entered once at a time"
        blocks, logits, head = GPT.blocks, GPT.logits, ScalarHead.forward
        self.originals = (blocks, logits, head)
        counter = self

        def counted_blocks(gpt, idx, *args, **kwargs):
            if gpt not in counter.sizes:
                counter.sizes[gpt] = block_parameters(gpt)
            counter.add(gpt, idx.numel(), counter.sizes[gpt])
            return blocks(gpt, idx, *args, **kwargs)

        def counted_logits(gpt, hidden):
            counter.add(gpt, hidden.numel() // hidden.size(-1), gpt.lm_head.weight.numel())
            return logits(gpt, hidden)

        def counted_head(scalar_head, hidden):
            counter.add(scalar_head, hidden.numel() // hidden.size(-1),
                        scalar_head.weight.numel() + scalar_head.bias.numel())
            return head(scalar_head, hidden)

        GPT.blocks, GPT.logits, ScalarHead.forward = counted_blocks, counted_logits, counted_head
        return self

    def __exit__(self, *exc):
        GPT.blocks, GPT.logits, ScalarHead.forward = self.originals
        self.originals = None
        return False
