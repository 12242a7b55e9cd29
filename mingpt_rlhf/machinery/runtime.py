"""What every training script sets up: device, precision, seeds, out_dir.

- `pick_device("auto")` takes CUDA, then Apple's MPS, then the CPU.
- `autocast(device, dtype)`: mixed precision on CUDA (bf16 where the GPU supports it), plain
  float32 elsewhere. Trained weights stay float32; only the matrix multiplies run in low
  precision. float16 also needs loss scaling, which `optim.Optimizer` does.
- `hold_frozen_in(model, dtype)`: a frozen model (PPO's reference and reward model) keeps its
  Linear weights in the autocast dtype: half the memory, and exactly the numbers autocast
  would have computed from float32 copies, since it casts them to that dtype anyway. A LoRA
  base is held so too, with a float32 copy on the CPU for the merged checkpoint.
- metrics.jsonl is written by `metrics.MetricsLog`.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import random

import numpy as np
import torch

from .distributed import is_main
from .errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device must be auto, cpu, cuda or mps, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps was asked for but MPS is not available; use --device cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on a CUDA GPU that supports it, else float32."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise UserError(f"--dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return DTYPES[name]


def autocast_of(device: torch.device, dtype: torch.dtype):
    """The mixed-precision context as a function of no arguments, chosen once: nothing in
    float32, torch's autocast to `dtype` otherwise (`amp()` opens one)."""
    if dtype == torch.float32:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device.type, dtype=dtype)


def autocast(device: torch.device, dtype: torch.dtype):
    return autocast_of(device, dtype)()


def hold_frozen_in(model: torch.nn.Module, dtype: torch.dtype,
                   keep_float32_base: bool = True) -> torch.nn.Module:
    """Cast the frozen Linear weights and biases of `model` to `dtype` (in place).

    Under autocast to `dtype` this changes no result: autocast casts float32 Linear weights
    to `dtype` before every matmul. Embeddings and LayerNorms stay float32; the output layer
    stays float32 too, tied to the token embedding or not (logits must be exact, model.py), and
    so do the reward and value heads, which compute in float32 (heads.ScalarHead).

    A model with LoRA is saved too: its checkpoint holds the base plus the adapters
    (lora.merged_state_dict), and a base rounded to bf16 there would be rounded again by each
    later LoRA stage. So each tensor cast here first leaves a float32 copy on the CPU
    (`float32_base`, read by the merge): the accelerator holds the base in `dtype` only, as
    without LoRA, and the copy costs host memory (4 bytes a parameter: 340 MB for GPT-2
    small's Linear layers), only on rank 0, the one that writes checkpoints.
    `keep_float32_base=False` skips the copies, for a LoRA model whose merged weights are
    never saved (PPO's critic)."""
    if dtype == torch.float32:
        return model
    from .lora import has_lora
    keep = keep_float32_base and has_lora(model) and is_main()
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for m in model.modules():
        if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2 \
                and not isinstance(m, torch.nn.Embedding) and id(m.weight) not in embeddings \
                and not getattr(m, "keep_float32", False):  # scalar heads (heads.ScalarHead)
            for name in ("weight", "bias"):
                p = getattr(m, name, None)
                if p is not None and not p.requires_grad:
                    if keep:
                        if not hasattr(m, "float32_base"):
                            m.float32_base = {}
                        if name not in m.float32_base:  # a second call finds it rounded
                            m.float32_base[name] = p.detach().to("cpu", torch.float32)
                    p.data = p.data.to(dtype)
    return model


def output_layer_in_tf32(model: torch.nn.Module) -> None:
    """`--tf32_output_layer`: `model`'s output layer (`GPT.logits`) multiplies on the GPU's TF32
    tensor cores, forward and backward, and every other float32 product of the process keeps
    the precision it had (torch's TF32 switch is process-wide: it is set around this product
    only). TF32 rounds each float32 operand to 10 bits of mantissa and sums in float32: at
    GPT-2's shape a log-prob moves by ~0.003 nats (bench/tf32_logprobs.py), where bf16 logits
    would move it by up to 0.5. The layer otherwise stays what model.py makes it (float32
    under autocast, the padded rows cut off). Replaces `model.logits` on this model only.
    (On a CPU the switch changes no product: the scripts refuse the option there,
    `check_tf32_output_layer`.)"""
    model.logits = functools.partial(tf32_logits, model)


def check_tf32_output_layer(wanted: bool, device: torch.device) -> None:
    """--tf32_output_layer is for CUDA GPUs: TF32 is the format of their tensor cores."""
    if wanted and device.type != "cuda":
        raise UserError(f"--tf32_output_layer is for CUDA GPUs (TF32 is their tensor cores' "
                        f"format); on {device.type} leave it off")


def tf32_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """GPT.logits with its product in TF32: (..., C) hidden states -> (..., vocab_size)."""
    weight = model.lm_head.weight
    with torch.autocast(hidden.device.type, enabled=False):
        logits = TF32Product.apply(hidden.to(weight.dtype), weight)
    return logits[..., :model.config.vocab_size]


def cuda_matmul_switch() -> tuple[str, object, object]:
    """(name, value meaning TF32, value now) of torch's switch for CUDA's float32 matmuls: its
    new form (`fp32_precision`, torch 2.9+), else the legacy `allow_tf32`. Never the other form
    on a torch that has the new one: reading a legacy form after a script set the new one (or
    the other way) is an error there, and the new form reads right after either."""
    switch = torch.backends.cuda.matmul
    name, on = ("fp32_precision", "tf32") if hasattr(switch, "fp32_precision") else ("allow_tf32", True)
    return name, on, getattr(switch, name)


@contextlib.contextmanager
def tf32_matmuls():
    """CUDA's float32 matmuls in TF32 inside the block only; the switch as it was after."""
    name, on, before = cuda_matmul_switch()
    setattr(torch.backends.cuda.matmul, name, on)
    try:
        yield
    finally:
        setattr(torch.backends.cuda.matmul, name, before)


class TF32Product(torch.autograd.Function):
    """hidden (..., C) @ weight (V, C)^T with TF32 allowed, in the backward's two products too
    (autograd would run them after the switch is back)."""

    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        with tf32_matmuls():
            return torch.nn.functional.linear(hidden, weight)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        grad_hidden = grad_weight = None
        with tf32_matmuls():
            if ctx.needs_input_grad[0]:
                grad_hidden = grad @ weight                                         # (..., C)
            if ctx.needs_input_grad[1]:
                grad_weight = grad.reshape(-1, grad.size(-1)).t() @ hidden.reshape(-1, hidden.size(-1))
        return grad_hidden, grad_weight


def require_room_for_prompt(max_new_tokens: int, block_size: int) -> None:
    """Sampling needs at least one prompt token before the `max_new_tokens` it may add."""
    if max_new_tokens >= block_size:
        raise UserError(f"--max_new_tokens {max_new_tokens} leaves no room for a prompt in the "
                        f"model's block_size {block_size}; lower it")


def seed_everything(seed: int) -> None:
    if not 0 <= seed < 2 ** 32:  # numpy's range
        raise UserError(f"--seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_out_dir(out_dir: str) -> None:
    """Create `out_dir` and prove it can be written, before any training: a path that is a
    file, or a folder that is read-only, is a UserError now rather than after the first eval.
    Under torchrun only rank 0 writes, so only rank 0 checks."""
    if not is_main():
        return
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir {out_dir} is a file; pass a folder")
    probe = os.path.join(out_dir, f".write_test{os.getpid()}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"cannot write to --out_dir {out_dir} ({e.strerror or e}); pass a folder "
                        f"you can write to") from None
