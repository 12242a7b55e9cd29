"""The optimizer step every stage shares: AdamW, per-group learning rates on one schedule
(`lr_at`: linear warm-up, then cosine or linear decay), gradient accumulation, clipping, and
loss scaling for float16.

    opt = Optimizer(groups, dtype, device, grad_clip=1.0)
    opt.set_lr_scale(lr_at(step, max_iters, 1.0, warmup))   # each group: its peak lr x scale
    for micro_batch in ...:
        opt.backward(loss / grad_accum)                      # gradients add up
    opt.step()                                               # clip, step, zero the gradients

Why each piece (groups, float16's scaler, torchrun's averaging, fused AdamW): docs/speed.md,
"The optimizer step".
"""
from __future__ import annotations

import math

import torch

from .machinery.distributed import average_gradients


class Optimizer:
    def __init__(self, groups: list[dict], dtype: torch.dtype, device: torch.device,
                 grad_clip: float = 1.0, betas=(0.9, 0.95)):
        """`groups`: AdamW parameter groups, each with "params", "lr" and "weight_decay"."""
        for g in groups:
            g["peak_lr"] = g["lr"]
        groups = [g for g in groups if g["params"]]
        self.params = [p for g in groups for p in g["params"]]
        self.adamw = torch.optim.AdamW(groups, betas=betas,
                                       fused=device.type in ("cpu", "cuda"))
        self.scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        self.grad_clip = grad_clip
        # steps not taken: float16 overflows (the scaler skips them) and non-finite losses
        # (the caller skips them, see `skip`); saved with the optimizer, so it counts the run
        self.skipped = 0

    def set_lr_scale(self, scale: float) -> None:
        """Every group's learning rate = its peak learning rate x `scale`."""
        for g in self.adamw.param_groups:
            g["lr"] = g["peak_lr"] * scale

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> bool:
        """Average the gradients over the ranks (under torchrun), clip, step, and zero the
        gradients. False when float16's loss scaler skipped the step (`_scaled_step`)."""
        average_gradients(self.params)  # every rank takes the same step (machinery/distributed.py)
        if self.scaler is not None:
            return self._scaled_step()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        self.adamw.step()
        self.adamw.zero_grad(set_to_none=True)
        return True

    def _scaled_step(self) -> bool:
        """`step` in float16: unscale, clip, then a step the scaler skips when a gradient is
        inf or NaN (it then lowers the scale, and `skipped` counts the step)."""
        self.scaler.unscale_(self.adamw)  # clip the true gradients, not the scaled ones
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        scale = self.scaler.get_scale()
        self.scaler.step(self.adamw)
        self.scaler.update()
        overflowed = self.scaler.get_scale() < scale
        self.skipped += overflowed
        self.adamw.zero_grad(set_to_none=True)
        return not overflowed

    def discard(self) -> None:
        """Drop the gradients gathered so far without a step (an update stopped early)."""
        self.adamw.zero_grad(set_to_none=True)

    def skip(self) -> None:
        """Drop the gradients gathered so far and count a step not taken (a non-finite loss)."""
        self.adamw.zero_grad(set_to_none=True)
        self.skipped += 1

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "skipped": self.skipped,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        # the moments and steps of the saved run, at this run's rates (a resumed run may be
        # given new ones; the saved groups would bring their old peak_lr back)
        peaks = [g["peak_lr"] for g in self.adamw.param_groups]
        self.adamw.load_state_dict(state["adamw"])
        for g, peak in zip(self.adamw.param_groups, peaks):
            g["peak_lr"] = peak
        self.skipped = state.get("skipped", 0)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def lr_at(step: int, max_steps: int, peak: float, warmup: int = 0, decay: str = "cosine",
          min_ratio: float = 0.0) -> float:
    """Learning rate at `step` (0-based): warm-up to `peak`, then decay to `min_ratio * peak`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    if decay == "cosine":
        scale = 0.5 * (1 + math.cos(math.pi * progress))
    elif decay == "linear":
        scale = 1 - progress
    else:
        scale = 1.0
    return peak * (min_ratio + (1 - min_ratio) * scale)
