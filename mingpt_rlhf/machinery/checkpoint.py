"""Checkpoints as files: atomic save, load with clear errors, and the RNG state for exact resume.

A checkpoint is one `torch.save`d dict. What goes in it is up to each script (model weights,
model config, tokenizer, optimizer, step, RNG state, its own config); this file only makes
sure that a killed run never leaves a half-written file: we write a temporary file in the
same folder and `os.replace` it over the old one, which is atomic on POSIX and Windows. How a
checkpoint becomes models again (and which tensor does not fit one of another shape):
mingpt_rlhf/stages.py.
"""
from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

from .errors import UserError


# what each stage's checkpoint holds and which script wrote it (the "stage" key of a checkpoint)
STAGES = {"sft": "an SFT policy (train_sft.py)", "rm": "a reward model (train_rm.py)",
          "ppo": "a PPO policy (train_ppo.py)", "grpo": "a GRPO policy (train_ppo.py --algo grpo)",
          "rloo": "an RLOO policy (train_ppo.py --algo rloo)",
          "reinforce++": "a REINFORCE++ policy (train_ppo.py --algo reinforce++)",
          "online_dpo": "an online DPO policy (train_ppo.py --algo online_dpo)",
          "distill": "a distilled policy (train_ppo.py --algo distill)", "dpo": "a DPO policy (train_dpo.py)"}


def describe_stage(stage) -> str:
    return STAGES.get(stage, f"a checkpoint of unknown stage {stage!r}")


def save_checkpoint(path: str, state: dict) -> None:
    """Write `state` to `path` atomically. A failed write (disk full, folder gone read-only)
    removes its temporary file, leaves the previous checkpoint as it was, and is a UserError.
    Under torchrun every rank holds the same weights and only rank 0 writes."""
    from .distributed import is_main
    if not is_main():
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise UserError(f"cannot write checkpoint {path} ({e.strerror or e}); free disk space or "
                        f"pass another --out_dir (the previous checkpoint, if any, is intact)") from None


def load_checkpoint(path: str, what: str = "checkpoint", hint: str = "", mmap: bool = False) -> dict:
    """Load a checkpoint dict to CPU. Missing or unreadable -> UserError naming the fix.

    `mmap=True` maps the file instead of reading it: a tensor's bytes are read from disk when
    it is used, so a later stage that needs the weights never reads the optimizer state saved
    beside them (twice the weights again). Used for the checkpoints of earlier stages, which
    this run does not rewrite; a run's own checkpoint (--resume) is read whole, because it
    is replaced while the run goes on."""
    if not os.path.isfile(path):
        raise UserError(f"no {what} at {path}" + (f"; {hint}" if hint else ""))
    try:
        # our checkpoints hold plain containers, tensors and numpy RNG state
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as e:  # truncated file, not a torch file, ...
        if mmap:  # a file torch cannot map (the old, non-zip format): read it whole
            return load_checkpoint(path, what, hint)
        raise UserError(f"cannot read {what} {path} ({type(e).__name__}: {e}); "
                        f"delete it and train again") from None


def resume_checkpoint(out_dir: str, resume: bool, stage: str):
    """(path of out_dir/ckpt.pt, its contents when resuming, else None). Resuming a checkpoint
    that another stage wrote (`stage` is the one this script writes) is refused."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not resume:
        return path, None
    ckpt = load_checkpoint(path, "checkpoint to resume", "run without --resume to start anew")
    if ckpt.get("stage") != stage:
        raise UserError(f"{path} holds {describe_stage(ckpt.get('stage'))}, not "
                        f"{describe_stage(stage)}; resume it with the script that wrote it, "
                        f"or pass another --out_dir")
    return path, ckpt


def rng_state() -> dict:
    """The global generators' states: Python's, numpy's, torch's CPU one and, on a CUDA
    machine, the current GPU's only (a checkpoint holding every visible GPU's could not be
    restored with fewer GPUs visible)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore `rng_state()`. A CUDA state on a machine without CUDA is left out, and a
    machine with CUDA resuming a checkpoint without one keeps its own (the note is printed by
    `restore_rank_rng`). Checkpoints of the earlier format hold a list (every GPU's): the
    current GPU's entry, if there is one, is used."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if isinstance(cuda, (list, tuple)):
        cuda = cuda[torch.cuda.current_device()] if torch.cuda.is_available() and \
            torch.cuda.current_device() < len(cuda) else None
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def rank_rng_states(**generators) -> list[dict]:
    """Every rank's random state, in rank order: the global generators plus `generators`
    (name -> torch.Generator) with the device type each lives on. Under torchrun each rank
    samples with its own streams, so an exact resume needs all of them; a single process
    saves a list of one."""
    from .distributed import gather
    own = {"global": rng_state(), **{name: g.get_state() for name, g in generators.items()},
           "devices": {name: g.device.type for name, g in generators.items()}}
    return gather(own)


def restore_rank_rng(ckpt: dict, where: str, **generators) -> None:
    """Restore this rank's entry of `rank_rng_states`, saved as ckpt["rng"] (the same names of
    `generators`). A single-process checkpoint of the earlier format (a dict, and each
    generator under "<name>_rng") is read as a list of one.

    A checkpoint moved between a CPU and a CUDA machine cannot restore a generator of the
    other device (their states differ in kind): that generator is reseeded from the restored
    CPU stream, with a one-line note. The run goes on, no longer bit-identical to an
    uninterrupted one on the first machine."""
    from .distributed import is_main, rank, world_size
    states = ckpt["rng"]
    if isinstance(states, dict):
        states = [{"global": states, **{name: ckpt[f"{name}_rng"] for name in generators}}]
    if len(states) != world_size():
        raise UserError(f"{where} was written by {len(states)} process(es) and this run has "
                        f"{world_size()}; resume with the same torchrun --nproc_per_node")
    own = states[rank()]
    set_rng_state(own["global"])
    moved = ("cuda" in own["global"]) != torch.cuda.is_available()
    saved_devices = own.get("devices", {})
    for name, g in generators.items():
        saved_on = saved_devices.get(name, g.device.type)
        if saved_on == g.device.type:
            try:
                g.set_state(own[name])
                continue
            except RuntimeError:  # an earlier checkpoint, without "devices", from another device
                pass
        moved = True
        # from the restored CPU stream, which every rank shares: + rank keeps the ranks'
        # sampling streams apart, as their first seeds were
        g.manual_seed(int(torch.randint(2 ** 62, (1,))) + 1000 * rank())
    if moved and is_main():
        print(f"note: {where} was written on another kind of device (CPU / CUDA); its random "
              f"streams of that device were reseeded, so from here the run samples other "
              f"tokens than it would have there")
