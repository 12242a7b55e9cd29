"""Our export (`python -m mingpt_rlhf.run.export`) against transformers 5.24: the folder
it writes loads with `AutoModelForCausalLM.from_pretrained`, and gives our logits. No download:
each model is built from a configuration with random weights.

    bench/peers/trl1/.venv/bin/python bench/export_parity.py               # the tiny cases
    bench/peers/trl1/.venv/bin/python bench/export_parity.py --fixtures    # and rewrite tests/fixtures/exports
    bench/peers/trl1/.venv/bin/python bench/export_parity.py --cases qwen3_0.6b   # Qwen3-0.6B's shape: 2.4 GB of weights, held several times

(the venv of bench/peers/trl1/setup.sh; this script puts the repository on sys.path itself).

For each case (CASES), with a family's tokenizer from tests/fixtures/tokenizers (GPT-2's in its
published vocab.json + merges.txt form; the built-in task's word tokenizer for `gpt2_word`):
1. a transformers model of the family is built with random weights, every tensor perturbed
   (bench/parity_models.py's `build_reference`), and saved with the tokenizer's files: a
   published folder, as a user downloads it (Qwen's with 40 embedding rows no token uses);
2. our side trains from it: `train_sft.py --init_from` the folder, 2 steps at lr 1e-2 on chat
   `messages` (GPT-2: prompt / response), full fine-tuning or LoRA (which writes merged
   weights), so what is exported is a trained checkpoint, not what was loaded; `gpt2_word` is a
   new model trained on the built-in task; `qwen3_0.6b` (a published shape) takes no training
   step but every tensor of ours perturbed again;
3. the export command writes the folder; transformers loads it (`AutoModelForCausalLM`,
   `AutoTokenizer`), and we compare, in float32:
   - logits of a left-padded batch (3 rows of 11, 6 and 2 real tokens; their position ids
     counting real tokens, as ours do) at every real position, on the columns both have (the
     tokenizer's ids and, for Qwen, PAD's row): `torch.testing.assert_close`, atol = rtol = 1e-4;
   - 32 greedy tokens per row, ours with our KV cache, theirs with theirs, both never choosing
     PAD or a row without a token (their `suppress_tokens`); a difference is allowed only where
     their two best logits are within 1e-3 (a tie), after which the row is not compared;
   - the tokenizer: `AutoTokenizer` on the folder gives our ids on the texts below (without
     special tokens; with them, ours with BOS first where the family has one), and the
     generation config's eos_token_id is our EOS;
   - our own loader on the folder (`GPT.from_pretrained`, `BPETokenizer.from_pretrained`): the
     same logits on every token's column, the same tokenizer.

Writes bench/results/export_parity.json (per case: the largest logit difference, the columns
compared, the tokens, ties, the files; the command, date, commit). With --fixtures, the tiny
cases but SmolLM2's (Llama's layout) are also written to tests/fixtures/exports/<case>/: the checkpoint (its weights, model
config and tokenizer: what the export reads), expected.json (the files written, config.json,
generation_config.json, each tensor's name, dtype, shape and sha256, each other file's sha256)
and reference.safetensors (the batch, transformers' logits at the real positions, its greedy
tokens and top-2 gaps), which tests/test_export.py checks without transformers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__ + "/.."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from parity_models import ATOL, LENGTHS, NEW_TOKENS, RTOL, TIE, batch, build_reference, compare_greedy, save_case  # noqa: E402
from results_file import measured  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "export_parity.json")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "exports")
TOKENIZERS = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
UNUSED_ROWS = 40  # Qwen's embedding has rows no token uses (151,936 rows, ~151,670 tokens)
TEXTS = ["Hello world! How are you today?", "  leading spaces, tabs\tand\nnew lines\n\n",
         "digits 1234567 and 3.14159", "émigré café naïve 東京 مرحبا 🙂👍🏽",
         "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>x<|eot_id|>", "<|endoftext|>", ""]

TINY = dict(hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256)
CASES = {
    # GPT-2: Conv1D weights, learned positions; its tokenizer as vocab.json + merges.txt
    "gpt2_tiny": dict(family="gpt2", tokenizer="gpt2", train="full",
                      config=dict(n_embd=16, n_layer=2, n_head=4, n_positions=64)),
    # the built-in task's word tokenizer: a new GPT-2-shaped model, weights and config only
    "gpt2_word": dict(family="gpt2", tokenizer="word", train="full", config={}),
    # Llama 3: the llama3 rope scaling (head_dim 8's four pairs: kept, blended, slowed, slowed
    # with an original context of 200), untied output layer: PAD's new row dropped from both
    "llama_tiny": dict(family="llama", tokenizer="llama3", train="full",
                       config=dict(TINY, rope_theta=500000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=200))),
    # SmolLM2: Llama's layout, tied, its tokenizer (EOS <|im_end|>, no BOS)
    "smollm2_tiny": dict(family="llama", tokenizer="smollm2", train="full",
                         config=dict(TINY, rope_theta=100000.0, rms_norm_eps=1e-5,
                                     tie_word_embeddings=True)),
    # Qwen2.5: q/k/v biases, tied, rows no token uses (PAD is one); trained with LoRA
    "qwen2_tiny": dict(family="qwen2", tokenizer="qwen2.5", train="lora", extra_rows=UNUSED_ROWS,
                       config=dict(TINY, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, use_sliding_window=False)),
    # Qwen3: q/k norms, a head width of its own (2 x 16 > 16), tied, unused rows
    "qwen3_tiny": dict(family="qwen3", tokenizer="qwen3", train="full", extra_rows=UNUSED_ROWS,
                       config=dict(TINY, head_dim=16, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True)),
    # Qwen3-0.6B's shape and its 151,936 rows, with the small Qwen3 tokenizer (so most rows
    # have no token, as 267 of Qwen3's do); not in the default cases
    "qwen3_0.6b": dict(family="qwen3", tokenizer="qwen3", train="perturb", embedding_rows=151936,
                       config=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=40960, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True)),
}
DEFAULT_CASES = [name for name in CASES if name != "qwen3_0.6b"]
FIXTURE_CASES = ("gpt2_tiny", "gpt2_word", "llama_tiny", "qwen2_tiny", "qwen3_tiny")  # SmolLM2 is Llama's layout


def write_tokenizer(name: str, folder: str):
    """The case's tokenizer files into `folder`; returns our tokenizer read from there. GPT-2's
    fixture (a tokenizer.json) is written as GPT-2 publishes it: vocab.json + merges.txt."""
    from mingpt_rlhf.tokenizer import BPETokenizer
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(TOKENIZERS, name)
    if name == "gpt2":
        with open(os.path.join(source, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
            # GPT-2's vocab.json holds <|endoftext|> too (an added token in tokenizer.json)
            json.dump({**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}},
                      f, ensure_ascii=False)
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(["#version: 0.2", *merges]) + "\n")
    else:
        for file in os.listdir(source):
            if file != "expected.json":
                shutil.copy(os.path.join(source, file), folder)
    return BPETokenizer.from_pretrained(folder)


def write_data(work: str, chat: bool) -> str:
    """A few demonstrations: chat `messages`, or prompt / response."""
    talk = [(f"What is {a} plus {a}?", f"It is {2 * a}.") for a in range(8)]
    path = os.path.join(work, "demos.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for q, r in talk:
            row = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": r}]} \
                if chat else {"prompt": q, "response": " " + r}
            f.write(json.dumps(row) + "\n")
    return path


def trained_checkpoint(name: str, case: dict, work: str, seed: int) -> str:
    """The folder of the checkpoint to export (steps 1 and 2 of the docstring)."""
    import train_sft
    from mingpt_rlhf.machinery.checkpoint import save_checkpoint
    from mingpt_rlhf.stages import load_policy
    out = os.path.join(work, "sft")
    common = dict(out_dir=out, max_iters=2, lr=1e-2, warmup_iters=0, batch_size=4, eval_interval=2,
                  eval_prompts=2, max_new_tokens=4, seed=seed, dtype="float32", device="cpu")
    if case["tokenizer"] == "word":
        train_sft.main(train_sft.Config(n_layer=2, n_head=2, n_embd=16, **common))
        return out
    folder = os.path.join(work, "model")
    tok = write_tokenizer(case["tokenizer"], folder)
    vocab = case.get("embedding_rows") or tok.n_tokens + case.get("extra_rows", 0)
    built = build_reference(dict(family=case["family"], size="tiny" if "tiny" in name else name,
                                 dtype="float32", config=dict(case["config"], vocab_size=vocab)), seed)
    save_case(built, dict(dtype="float32", shards=1, old_config=False), folder)
    del built
    if case["train"] == "perturb":
        model, tok, _ = load_policy("", init_from=folder)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        from dataclasses import asdict
        save_checkpoint(os.path.join(out, "ckpt.pt"), {
            "stage": "sft", "model": model.state_dict(), "model_config": asdict(model.config),
            "tokenizer": tok.state_dict(), "step": 0})
        return out
    train_sft.main(train_sft.Config(init_from=folder, data=write_data(work, case["family"] != "gpt2"),
                                    lora_rank=4 if case["train"] == "lora" else 0, **common))
    return out


def theirs(folder: str, ids, mask, suppressed: list[int]) -> dict:
    """transformers on the exported folder: logits, greedy tokens (the suppressed ids never
    chosen) and their top-2 gaps."""
    import logging

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    said = []  # what transformers warns about the folder while loading it (nothing, we expect)
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    hf_logging.get_logger("transformers").addHandler(handler)
    if hasattr(logging.Logger, "warning_once"):  # said once per process: say it again here
        logging.Logger.warning_once.cache_clear()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    dtypes = {p.dtype for p in model.parameters()}
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0, suppress_tokens=suppressed or None,
                             output_logits=True, return_dict_in_generate=True)
    steps = torch.stack(out.logits, 1).float()
    steps[..., suppressed] = -float("inf")  # output_logits are before the processors
    best2 = steps.topk(2, dim=-1).values
    return {"logits": logits, "greedy": out.sequences[:, ids.shape[1]:],
            "gap": best2[..., 0] - best2[..., 1], "dtypes": sorted(str(d) for d in dtypes),
            "eos": model.generation_config.eos_token_id, "class": type(model).__name__,
            "warnings": said}


def tokenizer_check(folder: str, tok) -> dict:
    """AutoTokenizer on the folder against ours on TEXTS."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(folder)
    plain = with_special = 0
    for text in TEXTS:
        ours = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ours, f"ids differ on {text!r}"
        plain += 1
        bos = [tok.bos_id] if tok.bos_id is not None else []
        assert hf.encode(text) == bos + ours, f"ids with special tokens differ on {text!r}"
        with_special += 1
    return {"texts": plain, "class": type(hf).__name__}


def ours_reloaded(folder: str, tok, ids, mask):
    """Our own loader on the exported folder: its logits on the token columns, and whether its
    tokenizer is ours."""
    from mingpt_rlhf.model import GPT
    from mingpt_rlhf.tokenizer import BPETokenizer, same_tokenizer
    model = GPT.from_pretrained(folder, vocab_size=tok.vocab_size)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
    same = same_tokenizer(BPETokenizer.from_pretrained(folder), tok) if tok.state_dict()["type"] == "bpe" else None
    return logits, same


def changed_tensors(source: str, folder: str) -> list[int]:
    """[tensors of the export that differ from the published folder's, tensors]: training (or
    the perturbation) changed what is exported (LoRA changes only the layers it adapts)."""
    from mingpt_rlhf.machinery.pretrained import read_weights
    before, _ = read_weights(source)
    after, _ = read_weights(folder)
    strip = lambda name: name.removeprefix("transformer.").removeprefix("model.")
    before = {strip(k): v for k, v in before.items()}
    same = sum(torch.equal(t.float(), before[strip(k)].float()[:len(t)]) for k, t in after.items())
    return [len(after) - same, len(after)]


def expected_files(folder: str) -> dict:
    """What tests/test_export.py checks an export against: the files, config.json,
    generation_config.json, each tensor's dtype, shape and sha256, each other file's sha256."""
    from mingpt_rlhf.machinery.pretrained import read_safetensors
    files = sorted(os.listdir(folder))
    read = lambda name: json.load(open(os.path.join(folder, name), encoding="utf-8"))
    sha = lambda data: hashlib.sha256(data).hexdigest()
    tensors = {name: [str(t.dtype).removeprefix("torch."), list(t.shape),
                      sha(t.contiguous().view(torch.uint8).numpy().tobytes())]
               for name, t in read_safetensors(os.path.join(folder, "model.safetensors")).items()}
    others = {name: sha(open(os.path.join(folder, name), "rb").read()) for name in files
              if name not in ("model.safetensors", "config.json", "generation_config.json")}
    return {"files": files, "config": read("config.json"),
            "generation_config": read("generation_config.json"), "tensors": tensors,
            "file_sha256": others}


def write_fixture(name: str, ckpt_dir: str, folder: str, ids, mask, ref: dict) -> None:
    """tests/fixtures/exports/<name>/: ckpt.pt (what the export reads of the checkpoint),
    expected.json, reference.safetensors."""
    from safetensors.torch import save_file
    dest = os.path.join(FIXTURES, name)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), map_location="cpu", weights_only=False)
    torch.save({k: ckpt[k] for k in ("stage", "model", "model_config", "tokenizer", "step")},
               os.path.join(dest, "ckpt.pt"))
    with open(os.path.join(dest, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected_files(folder), f, indent=1, ensure_ascii=False)
        f.write("\n")
    real = mask.bool()
    save_file({"ids": ids, "mask": mask, "logits": ref["logits"][real].contiguous(),
               "greedy": ref["greedy"].contiguous(), "gap": ref["gap"].contiguous()},
              os.path.join(dest, "reference.safetensors"),
              metadata={"made_by": "bench/export_parity.py --fixtures", "transformers": versions()["transformers"]})
    os.chmod(os.path.join(dest, "reference.safetensors"), 0o644)


def run_case(name: str, seed: int, fixtures: bool, keep: str = "") -> dict:
    from mingpt_rlhf.run.export import load_policy_checkpoint
    from mingpt_rlhf.run.export import main as export_main
    from mingpt_rlhf.sampling import generate
    case = CASES[name]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"export_{name}_") as work:
        ckpt_dir = trained_checkpoint(name, case, work, seed)
        folder = os.path.join(keep or work, f"{name}_hf")
        export_main([ckpt_dir, folder, "--overwrite"])
        model, tok, stage = load_policy_checkpoint(ckpt_dir)
        ids, mask = batch(tok.n_tokens if tok.pad_id >= tok.n_tokens else tok.vocab_size, seed)
        if tok.pad_id < tok.n_tokens:  # the word tokenizer: PAD is id 0, never in the batch
            ids = ids.clamp(min=1) * mask
        with torch.no_grad():
            logits = model(ids, attention_mask=mask)
        ours = generate(model, ids, mask, max_new_tokens=NEW_TOKENS, temperature=0, pad_token_id=tok.pad_id)
        rows = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
        suppressed = sorted({tok.pad_id, *range(tok.n_tokens, rows)} & set(range(rows)))
        ref = theirs(folder, ids, mask, suppressed)
        real = mask.bool()
        columns = min(logits.shape[-1], ref["logits"].shape[-1])
        torch.testing.assert_close(logits[real][:, :columns], ref["logits"][real][:, :columns],
                                   atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: logits differ: {m}")
        greedy = compare_greedy(ours.responses, ref["greedy"], ref["gap"])
        assert greedy["mismatch"] is None, f"{name}: greedy tokens differ: {greedy}"
        assert ref["eos"] == tok.eos_id, f"{name}: generation eos {ref['eos']} is not ours {tok.eos_id}"
        tokenizer = tokenizer_check(folder, tok) if tok.state_dict()["type"] == "bpe" else None
        changed = changed_tensors(os.path.join(work, "model"), folder) \
            if os.path.isdir(os.path.join(work, "model")) else None
        reloaded, same_tok = ours_reloaded(folder, tok, ids, mask)
        token_columns = min(tok.n_tokens, columns)
        reload_diff = float((reloaded[real][:, :token_columns] - logits[real][:, :token_columns]).abs().max())
        assert reload_diff == 0.0 and same_tok in (True, None), f"{name}: our reload differs"
        if fixtures and name in FIXTURE_CASES:
            write_fixture(name, ckpt_dir, folder, ids, mask, ref)
        files = sorted(os.listdir(folder))
    return {"family": case["family"], "tokenizer": case["tokenizer"], "stage": stage,
            "trained": case["train"], "tensors_changed": changed, "files": files,
            "load_warnings": ref["warnings"], "their_class": ref["class"],
            "their_dtypes": ref["dtypes"], "config_vocab_size": rows, "our_columns": logits.shape[-1],
            "their_columns": ref["logits"].shape[-1], "columns_compared": columns,
            "max_abs_logit_diff": float((logits[real][:, :columns] - ref["logits"][real][:, :columns]).abs().max()),
            "logit_scale": float(ref["logits"][real][:, :columns].abs().max()),
            "greedy_tokens_compared": greedy["compared"], "greedy_ties": greedy["ties"],
            "greedy_tokens": len(LENGTHS) * NEW_TOKENS, "tokenizer_check": tokenizer,
            "our_reload_max_diff": reload_diff, "seconds": round(time.perf_counter() - start, 1)}


def versions() -> dict:
    import tokenizers
    import transformers
    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "torch": torch.__version__}


def table(results: dict) -> str:
    """The cases of the JSON as a Markdown table (docs/families.md)."""
    lines = ["| case | tokenizer | trained | vocab_size written (our columns) | largest logit "
             "difference (largest logit) | greedy tokens equal (ties) | tokenizer ids |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results["cases"].items():
        tok = f"equal on {r['tokenizer_check']['texts']} texts" if r["tokenizer_check"] else "(none written)"
        lines.append(f"| {name} | {r['tokenizer']} | {r['trained']} | {r['config_vocab_size']:,} "
                     f"({r['our_columns']:,}) | {r['max_abs_logit_diff']:.1e} ({r['logit_scale']:.2f}) | "
                     f"{r['greedy_tokens_compared']} of {r['greedy_tokens']} ({r['greedy_ties']}) | {tok} |")
    runs = dict.fromkeys((r.get("command", results["command"]), r["measured"]) for r in results["cases"].values())
    made = "; ".join(f"`{command}`, {when}" for command, when in runs)
    return "\n".join(lines) + f"\n\n({made}; transformers {results['transformers']}, torch " \
        f"{results['torch']}; the table: `python bench/export_parity.py --table`)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true", help="print the JSON's table and exit")
    ap.add_argument("--cases", nargs="*", choices=list(CASES), default=DEFAULT_CASES)
    ap.add_argument("--fixtures", action="store_true", help="also rewrite tests/fixtures/exports/ (tiny cases)")
    ap.add_argument("--keep", default="", help="write the exported folders here (default: a temporary folder)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=RESULTS)
    args = ap.parse_args()
    if args.table:
        with open(args.json) as f:
            print(table(json.load(f)))
        return
    torch.set_num_threads(args.threads)
    import warnings
    warnings.filterwarnings("ignore")
    results = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)
    results.setdefault("cases", {})
    command = " ".join(["bench/peers/trl1/.venv/bin/python bench/export_parity.py", *sys.argv[1:]])
    when = measured(ROOT)  # before --fixtures changes tracked files
    for name in args.cases:
        result = run_case(name, args.seed, args.fixtures, args.keep)
        results["cases"][name] = {**result, "command": command, "measured": when}
        print(name, json.dumps(result), flush=True)
    results.update(command=command, tolerance={"atol": ATOL, "rtol": RTOL, "tie": TIE},
                   measured=when, **versions())
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(args.json + ".tmp", args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
