"""Out: a trained policy as a Hugging Face folder, which transformers loads as the model it came
from (and so can the tools that read such folders), with our logits.

    python -m mingpt_rlhf.run.export out/ppo out/ppo_hf
    python -m mingpt_rlhf.run.export out/q3/grpo out/q3/grpo_hf --dtype bfloat16

Any policy checkpoint: SFT, PPO, GRPO, RLOO, REINFORCE++, online DPO, DPO, distillation; full
fine-tuning or LoRA (a checkpoint's "model" holds the merged weights: machinery/lora.py). A
reward model is refused: it is a trunk with a scalar head, which no causal-LM class loads.

Concept. Loading reads a published folder into our GPT (pretrained.py for GPT-2, families.py
for Llama 3 / SmolLM2, Qwen2 / 2.5, Qwen3); exporting is the same reading backwards, from the
same tables: GPT-2's Conv1D weights transposed back to (in, out) (`ours_to_gpt2`); a family's
c_attn split into q_proj, k_proj, v_proj and c_fc into gate_proj, up_proj (`ours_to_family`,
WEIGHT_NAMES read from right to left); config.json written from our GPTConfig
(`gpt2_hparams`, `family_hparams`: the family follows from the parts, q/k/v biases Qwen2's,
q/k norms Qwen3's, neither Llama's). The folder holds

    config.json             the shapes, the family's settings, bos / eos ids, torch_dtype
    model.safetensors       the weights, float32 (or --dtype), written by our own writer
    generation_config.json  eos_token_id: the token our sampler stops at (the chat format's
                            end of turn, e.g. <|im_end|>), so transformers' generate stops there
    the tokenizer's files   as the checkpoint keeps them (read from --init_from's folder):
                            tokenizer.json, tokenizer_config.json, special_tokens_map.json and
                            chat_template.jinja where there were such files (the same JSON; its
                            spacing may differ), or GPT-2's vocab.json and merges.txt

The PAD row. Our tokenizers pad with the first id that has no token (tokenizer.py); the
embedding's rows written are the rows the family's config.json expects: the tokenizer's ids,
or the published embedding's rows where it had more (`max(embedding_rows, n_tokens)`). So
GPT-2, Llama 3 and SmolLM2 (whose PAD is a row we added) get their published `vocab_size`
(50,257; 128,256; 49,152) and our PAD row is dropped; Qwen's 151,936 rows are all written, and
PAD stays one of its rows that no token uses. A tied output layer stays tied (no lm_head
tensor written), an untied one is cut to the same rows. Our logits of every token are theirs;
the rows past the tokens have no token either way.

The built-in tasks' word tokenizer has no Hugging Face format: its models are written with
weights and config.json only (GPT-2's layout with our vocabulary), and the command says so.

The folder is written atomically: into a temporary folder beside it, renamed once complete. An
existing folder that is not empty is refused unless --overwrite; bad input (no checkpoint, a
reward model, a file that is not a checkpoint) ends with exit status 2 and one line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

import torch

from ..machinery.cli import OneLineParser
from ..machinery.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
USAGE = "pass the out_dir of a policy run (train_sft.py, train_ppo.py, train_dpo.py)"


def load_policy_checkpoint(path: str):
    """(GPT in eval mode, tokenizer, stage) of the checkpoint in `path` (a run's folder or its
    ckpt.pt). The weights stay pages of the memory-mapped file; nothing else is read."""
    from ..model import GPT, GPTConfig, build_empty, load_state_dict_checked
    from ..tokenizer import tokenizer_from_state
    from ..machinery.checkpoint import describe_stage, load_checkpoint
    if not os.path.exists(path):
        raise UserError(f"no folder or file {path}; {USAGE}")
    ckpt_path = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    ckpt = load_checkpoint(ckpt_path, "checkpoint", USAGE, mmap=True)
    if isinstance(ckpt, dict) and ckpt.get("stage") == "rm":
        raise UserError(f"{ckpt_path} holds {describe_stage('rm')}, not a policy; {USAGE}")
    if not isinstance(ckpt, dict) or not {"model", "model_config", "tokenizer"} <= set(ckpt):
        raise UserError(f"{ckpt_path} is not a policy checkpoint of mingpt_rlhf (it has no "
                        f"model, model_config and tokenizer); {USAGE}")
    tokenizer = tokenizer_from_state(ckpt["tokenizer"])
    model = build_empty(lambda: GPT(GPTConfig(**ckpt["model_config"])))
    load_state_dict_checked(model, ckpt["model"], ckpt_path, assign=True)
    return model.eval(), tokenizer, ckpt.get("stage")


def check_gpt2_layout(config) -> None:
    """A model of learned positions must be GPT-2's block throughout (GPT2LMHeadModel)."""
    if (config.rms_norm_eps, config.mlp_hidden, config.qkv_bias, config.qk_norm) != \
            (None, None, False, False) or config.n_kv_head != config.n_head or \
            config.head_dim * config.n_head != config.n_embd or not config.tie_embeddings:
        raise UserError("the model has learned positions but not the rest of GPT-2's block; no "
                        "Hugging Face class computes it")


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's files as the checkpoint keeps them (name -> text); none for the word
    tokenizer."""
    state = tokenizer.state_dict()
    if state["type"] != "bpe":
        return {}
    dump = lambda value: json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    if "files" not in state:  # GPT-2's two files
        return {"vocab.json": dump(state["encoder"]),
                "merges.txt": "\n".join(["#version: 0.2", *state["merges"]]) + "\n"}
    files = state["files"]
    out = {"tokenizer.json": dump(files["tokenizer.json"])}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if files.get(name):
            out[name] = dump(files[name])
    # a template kept in a file of its own (tokenizer_config.json without one) goes back there
    if files.get("chat_template") is not None and (files["tokenizer_config.json"] or {}).get("chat_template") is None:
        out["chat_template.jinja"] = files["chat_template"]
    return out


def hf_folder(model, tokenizer, dtype: str = "float32") -> tuple[dict, dict, dict[str, str]]:
    """What the folder holds: (config.json, the weights by their names, the other files by name
    -> text)."""
    from ..machinery.families import family_hparams, ours_to_family
    from ..machinery.lora import has_lora, merged_state_dict
    from ..machinery.pretrained import gpt2_hparams, ours_to_gpt2
    config = model.config
    if tokenizer.vocab_size != config.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{config.vocab_size} columns; they do not belong together")
    rows = max(config.embedding_rows, tokenizer.n_tokens)
    state = merged_state_dict(model) if has_lora(model) else model.state_dict()
    if config.rope_theta is None:
        check_gpt2_layout(config)
        hparams, tensors = gpt2_hparams(config, rows), ours_to_gpt2(state, config, rows)
    else:
        hparams, tensors = family_hparams(config, rows), ours_to_family(state, config, rows)
    special = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}
    if tokenizer.pad_id < tokenizer.n_tokens:  # a PAD with a token of its own (the word tokenizer)
        special["pad_token_id"] = tokenizer.pad_id
    # written even when None: a family's class would otherwise take its own default (GPT-2's
    # 50256, Llama's 1 and 2), ids our tokenizer may not have
    hparams.update(special, torch_dtype=dtype)
    generation = {k: v for k, v in special.items() if v is not None}
    files = {"generation_config.json": json.dumps(generation, indent=2) + "\n", **tokenizer_files(tokenizer)}
    return hparams, tensors, files


def export(model, tokenizer, out_dir: str, overwrite: bool = False, dtype: str = "float32") -> list[str]:
    """Write `model` (our GPT, LoRA adapters merged if it has any) and `tokenizer` as a Hugging
    Face folder `out_dir`, atomically. Returns the files' names."""
    from ..machinery.pretrained import write_safetensors
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    hparams, tensors, files = hf_folder(model, tokenizer, dtype)
    writers = {"config.json": lambda path: write_text(path, json.dumps(hparams, indent=2) + "\n"),
               "model.safetensors": lambda path: write_safetensors(
                   path, tensors, metadata={"format": "pt"}, dtype=DTYPES[dtype]),
               **{name: (lambda path, text=text: write_text(path, text)) for name, text in files.items()}}
    write_folder(out_dir, writers, overwrite)
    return list(writers)


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_folder(out_dir: str, writers: dict, overwrite: bool) -> None:
    """Each `writers[name](path)` into a temporary folder beside `out_dir`, which is then renamed
    to it: a killed export leaves no half-written folder under that name. A folder already
    there is replaced only if it is empty or `overwrite`."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"{out_dir} is a file; pass a folder to write")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise UserError(f"{out_dir} is not empty; pass --overwrite to replace it, or another folder")
    parent = os.path.dirname(out_dir)
    old = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out_dir)}.")
    except OSError as e:
        raise UserError(f"cannot write in {parent} ({e.strerror or e}); pass another folder") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # a folder's usual mode, not mkdtemp's private one
        for name, write in writers.items():
            write(os.path.join(tmp, name))
        if os.path.isdir(out_dir):  # empty, or --overwrite: set aside until the new one is in place
            old = tmp + ".old"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    except OSError as e:
        if old is not None and not os.path.exists(out_dir):
            os.rename(old, out_dir)
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"cannot write {out_dir} ({e.strerror or e}); free disk space or pass "
                        f"another folder (nothing was written there)") from None
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(old)


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m mingpt_rlhf.run.export", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir", help="the out_dir of a policy run (or its ckpt.pt)")
    ap.add_argument("out_dir", help="the folder to write (new, or empty)")
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES),
                    help="the weights' dtype in model.safetensors (default: float32, as trained)")
    ap.add_argument("--overwrite", action="store_true", help="replace out_dir if it is not empty")
    return ap


def main(argv=None) -> None:
    try:
        args = build_parser().parse_args(argv)
        model, tokenizer, stage = load_policy_checkpoint(args.ckpt_dir)
        names = export(model, tokenizer, args.out_dir, args.overwrite, args.dtype)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from ..machinery.checkpoint import describe_stage
    from ..machinery.families import family_of
    config = model.config
    layout = "gpt2" if config.rope_theta is None else family_of(config)
    print(f"wrote {args.out_dir} ({layout}, {args.dtype}) from {describe_stage(stage)}: {', '.join(names)}")
    rows = max(config.embedding_rows, tokenizer.n_tokens)
    if tokenizer.pad_id >= rows:
        print(f"vocab_size {rows}, the tokenizer's ids: our PAD row (id {tokenizer.pad_id}, never "
              f"sampled) is not written")
    elif tokenizer.pad_id >= tokenizer.n_tokens:
        print(f"vocab_size {rows}, every row of the embedding: PAD (id {tokenizer.pad_id}) is one "
              f"of the rows no token uses")
    if tokenizer.state_dict()["type"] != "bpe":
        print("note: the built-in tasks' word tokenizer has no Hugging Face format: wrote the "
              "weights and config.json only (its words are in the checkpoint)")
    print(f"load it: transformers.AutoModelForCausalLM.from_pretrained({args.out_dir!r})")


if __name__ == "__main__":
    main()
