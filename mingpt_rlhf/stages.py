"""What one stage hands the next: a run's checkpoint, read back as the models a later stage
starts from (the policy and its tokenizer, or the reward model), and what --resume restores of
a trained model.

    policy, tokenizer, origin = load_policy("out/sft")          # or load_policy("", "gpt2")
    rm = load_reward_model("out/rm", tokenizer, "out/sft")       # frozen, normalised
    save_checkpoint(path, {"model": weights_for_later_stages(actor), ...})

The files themselves (atomic writes, clear errors): machinery/checkpoint.py.
"""
from __future__ import annotations

import os

import torch

from .heads import RewardModel
from .machinery.checkpoint import describe_stage, load_checkpoint
from .machinery.distributed import is_main
from .machinery.errors import UserError
from .machinery.lora import (base_checksums, has_lora, merged_state_dict, same_base,
                             trainable_state_dict)
from .model import GPT, GPTConfig, build_empty, load_state_dict_checked
from .tokenizer import BPETokenizer, same_tokenizer, tokenizer_from_state


def weights_for_later_stages(module: torch.nn.Module) -> dict:
    """The state dict later stages (and sampling) load: with LoRA, the adapters merged in
    (on the CPU). Under torchrun only rank 0 writes checkpoints, so the other ranks build
    nothing (an empty dict)."""
    if not is_main():
        return {}
    return merged_state_dict(module) if has_lora(module) else module.state_dict()


def resume_state(module: torch.nn.Module) -> dict:
    """What --resume restores of a trained module: its whole state, or with LoRA only what
    trains (adapters, heads) and a fingerprint of the frozen base, which a resumed run
    rebuilds from where it came from."""
    if has_lora(module):
        return {"lora": trainable_state_dict(module), "base_checksums": base_checksums(module)}
    return {"state": module.state_dict()}


def load_resume_state(module: torch.nn.Module, saved: dict, where: str) -> None:
    """Restore what `resume_state` saved into a module built as the first run built it."""
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


def reward_model_from(ckpt: dict, path: str, tokenizer=None, policy_from: str = ""):
    """The frozen RewardModel (eval mode, dropout off, no gradients) saved in a train_rm.py
    checkpoint already loaded from `path`. Another stage's checkpoint is refused, and so is a
    reward model whose tokenizer differs from `tokenizer` (the policy's, from `policy_from`)."""
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
