"""Checkpoints: atomic save, load with clear errors, and the RNG state for exact resume.

A checkpoint is one `torch.save`d dict. What goes in it is up to each script (model weights,
model config, tokenizer, optimizer, step, RNG state, its own config); this file only makes
sure that (1) a killed run never leaves a half-written file: we write a temporary file in the
same folder and `os.replace` it over the old one, which is atomic on POSIX and Windows; and
(2) loading a checkpoint into a model of another shape says which tensor does not fit.
"""
from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

from .errors import UserError
from ..model import load_state_dict_checked


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


def weights_for_later_stages(module: torch.nn.Module) -> dict:
    """The state dict later stages (and sampling) load: with LoRA, the adapters merged in
    (on the CPU). Under torchrun only rank 0 writes checkpoints, so the other ranks build
    nothing (an empty dict)."""
    from .distributed import is_main
    from .lora import has_lora, merged_state_dict
    if not is_main():
        return {}
    return merged_state_dict(module) if has_lora(module) else module.state_dict()


def resume_state(module: torch.nn.Module) -> dict:
    """What --resume restores of a trained module: its whole state, or with LoRA only what
    trains (adapters, heads) and a fingerprint of the frozen base, which a resumed run
    rebuilds from where it came from."""
    from .lora import base_checksums, has_lora, trainable_state_dict
    if has_lora(module):
        return {"lora": trainable_state_dict(module), "base_checksums": base_checksums(module)}
    return {"state": module.state_dict()}


def load_resume_state(module: torch.nn.Module, saved: dict, where: str) -> None:
    """Restore what `resume_state` saved into a module built as the first run built it."""
    from .lora import base_checksums, has_lora, same_base, trainable_state_dict
    if "state" in saved:
        if has_lora(module):
            raise UserError(f"{where} was written by a run without LoRA; resume without "
                            f"--lora_rank")
        load_state_dict_checked(module, saved["state"], where)
        return
    if not has_lora(module):
        raise UserError(f"{where} was written by a LoRA run; resume with the same --lora_rank")
    own = trainable_state_dict(module)
    if set(own) != set(saved["lora"]) or any(own[k].shape != saved["lora"][k].shape for k in own):
        raise UserError(f"{where}: the adapters do not fit this model; resume with the same "
                        f"--lora_rank and --lora_targets")
    # the checksums are of the bases as loaded, before they were cast to the autocast dtype;
    # checkpoints written before them ("base_fingerprint", taken after the cast) resume unchecked
    if "base_checksums" in saved and not same_base(base_checksums(module), saved["base_checksums"]):
        raise UserError(f"{where}: the frozen base weights differ from the ones this LoRA run "
                        f"started from (was the SFT or RM checkpoint retrained?); start anew")
    module.load_state_dict(saved["lora"], strict=False)


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


def reward_model_from(ckpt: dict, path: str, tokenizer=None, policy_from: str = ""):
    """The frozen RewardModel (eval mode, dropout off, no gradients) saved in a train_rm.py
    checkpoint already loaded from `path`. Another stage's checkpoint is refused, and so is a
    reward model whose tokenizer differs from `tokenizer` (the policy's, from `policy_from`)."""
    from ..heads import RewardModel
    from ..model import GPTConfig, build_empty
    from ..tokenizer import same_tokenizer, tokenizer_from_state
    if ckpt.get("stage") != "rm":
        raise UserError(f"{path} is not a reward model (it holds "
                        f"{describe_stage(ckpt.get('stage'))}); pass the folder train_rm.py wrote")
    if tokenizer is not None and not same_tokenizer(tokenizer, tokenizer_from_state(ckpt["tokenizer"])):
        raise UserError(f"the reward model in {path} uses another tokenizer than the policy from "
                        f"{policy_from}; train the RM from the same SFT checkpoint (--sft_dir)")
    rm = build_empty(lambda: RewardModel(GPTConfig(**ckpt["model_config"])))
    # frozen: the weights are the checkpoint's own tensors (pages of the file when mapped)
    load_state_dict_checked(rm, ckpt["model"], path, assign=True)
    rm.gpt.set_dropout(0.0)
    return rm.eval().requires_grad_(False)


def load_reward_model(rm_dir: str, tokenizer=None, policy_from: str = ""):
    """`reward_model_from` the checkpoint in `rm_dir`."""
    path = os.path.join(rm_dir, "ckpt.pt")
    return reward_model_from(load_checkpoint(path, "reward model checkpoint",
                                             "run train_rm.py first or pass --rm_dir", mmap=True),
                             path, tokenizer, policy_from)


def load_policy(sft_dir: str, init_from: str = "", flag: str = "--sft_dir", frozen: bool = False):
    """The policy a later stage starts from, and its tokenizer: the SFT checkpoint in `sft_dir`,
    or published weights when `init_from` names a model or folder (skipping SFT): GPT-2, or a
    folder of Llama 3 / SmolLM2, Qwen2 / 2.5 or Qwen3 (`GPT.from_pretrained`).

    Returns (GPT in eval mode with dropout off, tokenizer, origin), where origin records where
    the weights came from (saved in the next checkpoint). Only the weights are read from the
    checkpoint (it is memory-mapped; its optimizer state stays on disk). `frozen=True` (a
    reference model, no gradients) keeps them as pages of the file instead of copying them."""
    from ..model import GPT, GPTConfig, build_empty
    from ..tokenizer import BPETokenizer, tokenizer_from_state
    if init_from:
        tokenizer = BPETokenizer.from_pretrained(init_from)
        model = GPT.from_pretrained(init_from, vocab_size=tokenizer.vocab_size)
        origin = {"init_from": init_from}
    else:
        path = os.path.join(sft_dir, "ckpt.pt")
        sft = (load_checkpoint(path, "SFT checkpoint", "run train_sft.py first or pass --sft_dir",
                               mmap=True)
               if flag == "--sft_dir" else
               load_checkpoint(path, "checkpoint", f"pass {flag} the folder of a trained policy",
                               mmap=True))
        if sft.get("stage") == "rm":
            raise UserError(f"{path} is a reward model, not a policy: pass the folder of an SFT, "
                            f"PPO, GRPO, RLOO or DPO run")
        tokenizer = tokenizer_from_state(sft["tokenizer"])
        model = build_empty(lambda: GPT(GPTConfig(**sft["model_config"])))
        load_state_dict_checked(model, sft["model"], path, assign=frozen)
        origin = {"path": os.path.abspath(path), "step": sft["step"]}
        del sft  # the rest of the checkpoint (optimizer state, ...) is never read
    model.set_dropout(0.0)
    if frozen:
        model.requires_grad_(False)
    return model.eval(), tokenizer, origin
