"""Padding-free forward passes: the real tokens of a padded batch, packed into few rows.

An RL minibatch is mostly padding: prompts are padded on the left to the longest prompt and
responses on the right to the longest response, so in the built-in pipeline 57 % of a
minibatch's positions are padding (measured: 16 rows of width 26, 43 % real tokens). Every
layer would spend most of its work on them. Instead, `GPT.trunk` packs the real tokens of
each row, one after another, into as few rows as hold them (first fit, longest first,
rows no wider than the longest sequence), runs the blocks on those, and puts each hidden
state back where its token was:

    padded (B, T)        packed (P, W)            attention inside one packed row
    . . a a a a          a a a a b b              a sees a's earlier tokens only,
    . . . b b .    ->    c c c c c .              b sees b's: a block-diagonal causal
    c c c c c .                                   mask, so every token sees exactly what
                                                  it saw in its padded row

Positions still count each sequence's real tokens from 0, so every real token gets the hidden
state it gets in the padded batch (to float rounding: the matrix products have other shapes).
Padding positions get zeros instead of the unused values they had.

    python -m mingpt_rlhf.machinery.packing      # shows a packing of three rows
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# pack only when it saves at least this share of the positions (packing costs a few small ops)
MIN_SAVING = 0.25


@dataclass
class Packing:
    """Where each real token of a (B, T) batch sits in the packed (rows, width) batch."""
    batch: int                  # B, T: the padded shape
    length: int
    rows: int                   # P, W: the packed shape
    width: int
    real: torch.Tensor          # (M,) flat index into B * T of each real token, row by row
    slot: torch.Tensor          # (M,) flat index into P * W of the same token
    position_ids: torch.Tensor  # (P, W) each token's position within its own sequence
    attn_mask: torch.Tensor     # (P, 1, W, W) bool: same sequence and not in the future

    @classmethod
    def of(cls, attention_mask: torch.Tensor, min_saving: float | None = None) -> "Packing | None":
        """The packing of a (B, T) mask of real tokens, or None when it would save less than
        `min_saving` (default MIN_SAVING) of the positions."""
        min_saving = MIN_SAVING if min_saving is None else min_saving
        B, T = attention_mask.shape
        mask = attention_mask.bool()  # a float or int mask alike
        lengths = mask.sum(-1).tolist()
        width = max(1, max(lengths))
        fill, line, start = [], [0] * B, [0] * B  # tokens in each packed row; each row's place
        for b in sorted(range(B), key=lambda b: -lengths[b]):
            line[b] = next((i for i, used in enumerate(fill) if used + lengths[b] <= width), len(fill))
            if line[b] == len(fill):
                fill.append(0)
            start[b] = fill[line[b]]
            fill[line[b]] += lengths[b]
        rows = len(fill)
        if rows * width > (1 - min_saving) * B * T:
            return None
        device = attention_mask.device
        real = mask.flatten().nonzero().squeeze(-1)                           # (M,)
        row = real // T
        within = (mask.long().cumsum(-1) - 1).flatten()[real]                   # (M,) 0, 1, ...
        offset = torch.tensor([line[b] * width + start[b] for b in range(B)], device=device)
        slot = offset[row] + within                                           # (M,)
        position_ids = torch.zeros(rows * width, dtype=torch.long, device=device)
        position_ids[slot] = within
        sequence = torch.full((rows * width,), -1, dtype=torch.long, device=device)
        sequence[slot] = row                                                  # -1: unused slot
        sequence = sequence.view(rows, width)
        k = torch.arange(width, device=device)
        causal = k[None, :] <= k[:, None]                                     # (W, W)
        same = sequence[:, :, None] == sequence[:, None, :]                   # (P, W, W)
        # an unused slot sees itself only: a row of the mask with nothing allowed is NaN
        attn_mask = (same & causal & (sequence[:, :, None] >= 0)) | torch.eye(width, dtype=torch.bool,
                                                                               device=device)
        return cls(B, T, rows, width, real, slot, position_ids.view(rows, width), attn_mask[:, None])

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (P, W, ...): the real tokens' entries in their packed places, zeros
        in the unused slots."""
        flat = x.reshape(self.batch * self.length, *x.shape[2:])[self.real]
        out = flat.new_zeros(self.rows * self.width, *x.shape[2:]).index_copy(0, self.slot, flat)
        return out.view(self.rows, self.width, *x.shape[2:])

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(P, W, ...) -> (B, T, ...): each real token's entry back in its padded place, zeros
        at padding. Differentiable."""
        flat = x.reshape(self.rows * self.width, *x.shape[2:])[self.slot]
        out = flat.new_zeros(self.batch * self.length, *x.shape[2:]).index_copy(0, self.real, flat)
        return out.view(self.batch, self.length, *x.shape[2:])


if __name__ == "__main__":
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 0]])
    p = Packing.of(mask, min_saving=0.0)
    print(f"{tuple(mask.shape)} -> {p.rows} x {p.width}")
    print("positions\n", p.position_ids)
    print("packed ids\n", p.pack(torch.arange(18).view(3, 6) * mask))
