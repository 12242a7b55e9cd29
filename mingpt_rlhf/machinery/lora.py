"""LoRA (Hu et al. 2021, "Low-Rank Adaptation"): train a small update of each chosen weight.

A frozen Linear layer `y = W x + b` becomes

    y = W x + b + (alpha / r) * B (A x),     A: (r, in), B: (out, r), r << in, out

and only A and B are trained. B starts at 0, so the adapted model starts exactly where the
base model is; A starts small and random, so B's gradient is not 0. For GPT-2 small with
r = 16 on the attention and MLP projections that is 2.4 M trained parameters instead of 124 M:
no gradients and no AdamW state (16 bytes per parameter) for the rest.

What the rest of the code relies on:
- `add_lora(model, rank, alpha, targets)` freezes every parameter of `model` and adapts the
  Linear layers of its blocks whose name is in `targets` (default: every attention and MLP
  projection, `c_attn`, `c_proj`, `c_fc`; a name the blocks lack is refused, with the names
  they have). The adapted layer keeps the names `weight` and `bias`, so the GPT-2 names of the
  state dict do not change; the adapters add `lora_A` and `lora_B`.
- Today's families (model.py) keep those three names: c_attn holds q_proj, k_proj and v_proj
  stacked, so its adapter is one low-rank update of the three (one A shared, B's rows for
  each); c_fc holds SwiGLU's gate_proj and up_proj; c_proj is o_proj in the attention and
  down_proj in the MLP (TARGETS_HELP).
  Heads added later (reward, value) are trained as usual.
- `adapters_disabled(model)`: inside it the model computes with its base weights only. In PPO
  with LoRA this *is* the reference policy: no second copy of the model is kept.
- `merged_state_dict(model)`: the state dict with `W + (alpha / r) B A` written into `weight`
  and no adapter entries: what checkpoints hold as "model", so every later stage (and
  sampling) reads a LoRA run like any other. W is the float32 base as loaded, also when the
  run holds it in bf16 (`runtime.hold_frozen_in` keeps a float32 copy on the CPU), so a
  chain of LoRA stages never rounds the base.

Try it:  python -c "from mingpt_rlhf.model import *; from mingpt_rlhf.machinery.lora import *; m=GPT(GPTConfig()); add_lora(m, 8, 16); print(sum(p.numel() for p in m.parameters() if p.requires_grad))"
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import UserError

DEFAULT_TARGETS = ("c_attn", "c_proj", "c_fc")  # every attention and MLP projection of GPT-2
TARGETS_HELP = ("comma-separated Linear layers LoRA adapts: c_attn (queries, keys and values; "
                "Llama / Qwen's q_proj, k_proj, v_proj stacked), c_proj (the attention's and the "
                "MLP's output: o_proj, down_proj), c_fc (the MLP's input: gate_proj and up_proj)")
# a checkpoint's names of today's families -> the layer of ours that holds them
OURS_OF = {"q_proj": "c_attn", "k_proj": "c_attn", "v_proj": "c_attn", "o_proj": "c_proj",
           "gate_proj": "c_fc", "up_proj": "c_fc", "down_proj": "c_proj"}


class LoRALinear(nn.Module):
    """A frozen Linear layer plus a trainable low-rank update; same `weight` and `bias`."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight.requires_grad_(False)  # the same tensors, not copies
        self.bias = base.bias.requires_grad_(False) if base.bias is not None else None
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device))
        # A as nn.Linear initialises its weight; B = 0 makes the update start at exactly 0
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.lora_A, -bound, bound)
        self.scale = alpha / rank
        self.enabled = True

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.enabled:
            # scale the small (.., r) tensor and add in place: the update then costs one more
            # (.., out) tensor, not three (GPT-2's c_fc outputs are 100 MB at batch 32 x 256)
            y = y.add_(F.linear(F.linear(x, self.lora_A) * self.scale, self.lora_B))
        return y

    def merged_weight(self) -> torch.Tensor:
        """W + (alpha / r) B A, in float32, on the CPU: only a checkpoint needs it, and a GPU
        need not hold a second float32 copy of every adapted weight while it is written.
        W is the base as loaded, not the copy held in bf16 for speed (`float32_base`)."""
        cpu = lambda t: t.detach().to("cpu", torch.float32)
        return float32_base(self, "weight") + self.scale * (cpu(self.lora_B) @ cpu(self.lora_A))


def add_lora(model: nn.Module, rank: int, alpha: float, targets=DEFAULT_TARGETS) -> int:
    """Freeze `model` and put adapters on the Linear layers named in `targets`.
    Returns the number of layers adapted; a name that matches nothing is a UserError."""
    if rank <= 0:
        raise UserError(f"--lora_rank must be positive, got {rank}")
    valid = target_names(model)
    unknown = [t for t in targets if t not in valid]
    if unknown:
        hint = "".join(f" ({t} is part of our {OURS_OF[t]})" for t in unknown if t in OURS_OF)
        raise UserError(f"--lora_targets {','.join(unknown)} names no Linear layer of this "
                        f"model's blocks{hint}; choose among {','.join(valid)}")
    model.requires_grad_(False)
    model.lora_base_checksum = base_fingerprint(model)  # before any cast (stages.resume_state)
    for block in blocks_of(model):
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if name in targets and isinstance(child, nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank, alpha))
    return sum(isinstance(m, LoRALinear) for m in model.modules())


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of `model` (a GPT, or a head on one): the modules that hold an
    attention and an MLP (model.Block, known by its parts so that LoRA needs no import of the
    model)."""
    return [m for m in model.modules() if hasattr(m, "attn") and hasattr(m, "mlp")]


def target_names(model: nn.Module) -> list[str]:
    """The names --lora_targets may give: the Linear layers inside the model's blocks (c_attn,
    c_fc, c_proj for GPT-2 and for each of today's families alike)."""
    return sorted({name.rsplit(".", 1)[-1] for block in blocks_of(model)
                   for name, m in block.named_modules() if isinstance(m, nn.Linear)})


def parse_targets(text: str) -> tuple[str, ...]:
    """'c_attn,c_fc' -> ('c_attn', 'c_fc'). The output layer is refused: `GPT.logits` reads
    its weight (tied to the token embedding) directly, so an adapter there would never act."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    if not targets:
        raise UserError("--lora_targets is empty; name layers such as c_attn,c_proj,c_fc")
    if "lm_head" in targets:
        raise UserError("--lora_targets lm_head: the output layer is read as a weight (tied to the "
                        "token embedding), so an adapter there would never act; adapt the "
                        "blocks' layers (c_attn,c_proj,c_fc)")
    return targets


def check_lora_options(cfg) -> None:
    """UserError for impossible --lora_rank / --lora_alpha / --lora_targets."""
    if cfg.lora_rank < 0:
        raise UserError(f"--lora_rank must be >= 0 (0 = no LoRA), got {cfg.lora_rank}")
    if cfg.lora_rank > 0 and cfg.lora_alpha <= 0:
        raise UserError(f"--lora_alpha must be positive, got {cfg.lora_alpha}")
    parse_targets(cfg.lora_targets)


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The base model: every adapter of `model` switched off inside the block."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m in layers:
            m.enabled = True


def float32_base(module: nn.Module, name: str) -> torch.Tensor:
    """`module`'s frozen `name` ("weight", "bias") in float32 on the CPU, as it was loaded:
    the copy `runtime.hold_frozen_in` kept when it cast the tensor to bf16 / fp16, else the
    tensor itself."""
    kept = getattr(module, "float32_base", {})
    return kept[name] if name in kept else getattr(module, name).detach().to("cpu", torch.float32)


def merged_state_dict(model: nn.Module) -> dict:
    """The state dict of the model as if it had no adapters: each adapted `weight` replaced
    by the merged one (float32, built on the CPU), `lora_A` / `lora_B` left out. Every
    frozen tensor held in bf16 / fp16 (`hold_frozen_in`) is saved as loaded, in float32."""
    prefix = lambda name: f"{name}." if name else ""
    merged = {prefix(name) + "weight": module
              for name, module in model.named_modules() if isinstance(module, LoRALinear)}
    kept = {prefix(name) + key: tensor for name, module in model.named_modules()
            for key, tensor in getattr(module, "float32_base", {}).items()}
    # the other tensors are the model's own (no copy; the tied embedding stays one tensor)
    return {k: merged[k].merged_weight() if k in merged else kept.get(k, v)
            for k, v in model.state_dict().items() if not k.endswith(("lora_A", "lora_B"))}


def trainable_state_dict(model: nn.Module) -> dict:
    """The parameters that train (adapters, heads): all a LoRA run needs to resume, since the
    frozen base is rebuilt from where it came from."""
    return {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}


def base_fingerprint(model: nn.Module) -> list[tuple[float, float]]:
    """A checksum of each frozen tensor of `model`: (sum, sum of magnitudes), in float32
    (Apple's MPS has no float64)."""
    with torch.no_grad():
        return [(p.float().sum().item(), p.float().abs().sum().item())
                for p in model.parameters() if not p.requires_grad]


def base_checksums(model: nn.Module) -> list[tuple[float, float]]:
    """The `base_fingerprint` of each base that `add_lora` adapted inside `model`, taken when
    it was frozen, in float32: what a LoRA checkpoint saves and a resumed run compares. Taken
    then, it does not depend on the dtype the base is held in afterwards (`hold_frozen_in`)."""
    return [pair for m in model.modules() if hasattr(m, "lora_base_checksum")
            for pair in m.lora_base_checksum]


def same_base(a: list, b: list) -> bool:
    """Checksums of the same tensors: equal up to float32 summation order (a GPU sums in
    another order than a CPU), 1e-5 of each tensor's sum of magnitudes. A retrained base
    moves every tensor's checksums by far more. A small edit of a large tensor (one row of
    GPT-2's 50,257-row embedding) can pass: this guards against resuming on another base,
    not against tampering."""
    if len(a) != len(b):
        return False
    for (sum_a, mag_a), (sum_b, mag_b) in zip(a, b):
        tolerance = 1e-5 * max(1.0, mag_a, mag_b)
        if abs(sum_a - sum_b) > tolerance or abs(mag_a - mag_b) > tolerance:
            return False
    return True
