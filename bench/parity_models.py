"""Parity of our GPT with the reference implementation (transformers 5.24) for today's
families: Llama 3 (with its "llama3" rope scaling), SmolLM2 (Llama's layout), Qwen2 / 2.5 and
Qwen3. No download: each model is built from a configuration with random weights.

    bench/peers/trl1/.venv/bin/python bench/parity_models.py               # every case
    bench/peers/trl1/.venv/bin/python bench/parity_models.py --cases llama_tiny qwen3_tiny
    bench/peers/trl1/.venv/bin/python bench/parity_models.py --fixtures    # rewrite tests/fixtures/models
    python bench/parity_models.py --table        # the Markdown table of the JSON (docs/families.md)
    python bench/parity_models.py --sizes        # published models' sizes in our GPT (docs/families.md)

(the venv of bench/peers/trl1/setup.sh; this script puts the repository on sys.path itself).

For each case (CASES): a transformers model of the family and size (tiny ones, each with its
family's own parts switched on, and two at published shapes: Qwen3-0.6B and SmolLM2-135M) is
built with random weights, and then **every tensor is perturbed** (embeddings, projections,
biases, norm weights: a loader that dropped a bias or a norm would go unseen with the zero
biases and unit norms of a fresh model). It is saved (the case's dtype, one file or shards,
and for one case config.json rewritten in the older layout published files have: `rope_theta`
and `rope_scaling` instead of transformers 5's `rope_parameters`), loaded again by
transformers from that folder (so the reference reads what we read), and by our
`GPT.from_pretrained`. Then, in float32:
- logits of a left-padded batch (3 rows of 11, 6 and 2 real tokens), theirs with position ids
  counting real tokens only, as ours count them (transformers' generate does the same): equal
  at every real position within atol = rtol = 1e-4 (`torch.testing.assert_close`);
- greedy generation of 32 tokens from the same batch, ours with our KV cache, theirs with
  theirs: the same tokens, where a difference is allowed only at a position whose two best
  logits (theirs) are within 1e-3 of each other (a tie that float rounding may break either
  way), after which that row is not compared further.

Writes bench/results/parity_models.json (per case: the largest logit difference, the tokens
compared, ties, seconds, with the command, date and commit). With --fixtures, the tiny cases
are also written to tests/fixtures/models/<case>/ (config.json, the weights, and
reference.safetensors: the batch, their logits, their greedy tokens and the gap between their
two best logits at each step), which tests/test_families.py checks without transformers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from results_file import measured  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "parity_models.json")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")
ATOL = RTOL = 1e-4
TIE = 1e-3         # two best logits closer than this: either token is a right greedy choice
NEW_TOKENS = 32
LENGTHS = (11, 6, 2)  # real tokens of each row of the batch, left-padded to the longest

TINY = dict(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
CASES = {
    # Llama 3.x: rope_theta 500,000 with the llama3 scaling. With an original context of 200
    # positions, head_dim 8's four pairs (wavelengths 6, 167, 4,443 and 118,000 positions) are
    # kept, blended, slowed and slowed; untied output layer; float32 file; config.json in the
    # published (older) layout
    "llama_tiny": dict(family="llama", size="tiny", dtype="float32", shards=1, old_config=True,
                       config=dict(TINY, hidden_size=32, intermediate_size=24,
                                   max_position_embeddings=256, rope_theta=500000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=200))),
    # Qwen2 / 2.5: biases on q, k, v; tied; bfloat16 file in two shards
    "qwen2_tiny": dict(family="qwen2", size="tiny", dtype="bfloat16", shards=2, old_config=False,
                       config=dict(TINY, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, use_sliding_window=False,
                                   sliding_window=32, max_window_layers=1)),
    # Qwen3: RMSNorm on each head's q and k, head_dim 8 (4 x 8 = 32 > hidden 16); tied; float16
    "qwen3_tiny": dict(family="qwen3", size="tiny", dtype="float16", shards=1, old_config=False,
                       config=dict(TINY, head_dim=8, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True)),
    # the published shapes (random weights): Qwen3-0.6B and SmolLM2-135M
    "qwen3_0.6b": dict(family="qwen3", size="Qwen3-0.6B", dtype="float32", shards=3, old_config=False,
                       config=dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                   num_hidden_layers=28, num_attention_heads=16,
                                   num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=40960, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "smollm2_135m": dict(family="llama", size="SmolLM2-135M", dtype="float32", shards=1, old_config=True,
                         config=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                     num_hidden_layers=30, num_attention_heads=9,
                                     num_key_value_heads=3, head_dim=64,
                                     max_position_embeddings=8192, rope_theta=100000.0,
                                     rms_norm_eps=1e-5, tie_word_embeddings=True)),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_reference(case: dict, seed: int):
    """A transformers model of the case with every tensor perturbed: weights and embeddings
    by noise of half their init scale, biases drawn around 0, norm weights around 1. Tiny
    models get larger weights (init 0.2), so their logits spread over a few units and a wrong
    detail moves them far beyond the tolerance."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    init = 0.2 if case["size"] == "tiny" else 0.02
    config = AutoConfig.for_model(case["family"], initializer_range=init, **case["config"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(init * torch.randn_like(p))
            else:
                p.add_(0.5 * init * torch.randn_like(p))
            # the file's dtype decides the values both sides read: round to it here
            p.copy_(p.to(DTYPES[case["dtype"]]).float())
    return model


def save_case(model, case: dict, folder: str) -> None:
    """Save in the case's dtype and shard count; the older config.json layout if asked."""
    size = sum(p.numel() * DTYPES[case["dtype"]].itemsize for p in model.state_dict().values())
    shard = -(-size // case["shards"]) if case["shards"] > 1 else "1000GB"
    model.to(DTYPES[case["dtype"]]).save_pretrained(folder, max_shard_size=shard)
    model.float()
    if case["old_config"]:  # rope_theta + rope_scaling, as published config.json files have them
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            hparams = json.load(f)
        rope = hparams.pop("rope_parameters")
        hparams["rope_theta"] = rope.pop("rope_theta")
        hparams["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
        with open(path, "w") as f:
            json.dump(hparams, f, indent=2)


def batch(vocab: int, seed: int):
    """Left-padded ids (B, T) and mask: rows of LENGTHS real tokens; pads hold id 0."""
    g = torch.Generator().manual_seed(seed)
    T = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        ids[i, T - n:] = torch.randint(0, vocab, (n,), generator=g)
        mask[i, T - n:] = 1
    return ids, mask


def reference_outputs(model, ids, mask) -> dict:
    """Their logits (float32, zeros at pads), greedy tokens and top-2 gaps at each step."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    steps = torch.stack(out.logits, 1).float()                  # (B, new, V)
    best2 = steps.topk(2, dim=-1).values
    return {"ids": ids, "mask": mask, "logits": logits * mask[..., None],
            "greedy": out.sequences[:, ids.shape[1]:], "gap": best2[..., 0] - best2[..., 1]}


def compare_greedy(ours, theirs, gap) -> dict:
    """Tokens compared, ties met, and the first position (row, step) that differs without a tie."""
    compared = ties = 0
    for row in range(len(ours)):
        for t in range(ours.shape[1]):
            if ours[row, t] == theirs[row, t]:
                compared += 1
                continue
            if gap[row, t] > TIE:
                return {"compared": compared, "ties": ties, "mismatch": [row, t]}
            ties += 1
            break  # from here the two continue other sequences
    return {"compared": compared, "ties": ties, "mismatch": None}


def ours_outputs(folder: str, ids, mask) -> tuple:
    from mingpt_rlhf.model import GPT
    from mingpt_rlhf.sampling import generate
    model = GPT.from_pretrained(folder)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask) * mask[..., None]
    out = generate(model, ids, mask, max_new_tokens=NEW_TOKENS, temperature=0)
    return logits, out.responses


def run_case(name: str, seed: int, fixtures: bool) -> dict:
    case = CASES[name]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"parity_{name}_") as work:
        folder = os.path.join(work, "model")
        built = build_reference(case, seed)
        save_case(built, case, folder)
        del built
        from transformers import AutoModelForCausalLM
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ids, mask = batch(case["config"]["vocab_size"], seed)
        ref = reference_outputs(reference, ids, mask)
        del reference
        logits, greedy = ours_outputs(folder, ids, mask)
        real = mask.bool()
        torch.testing.assert_close(logits[real], ref["logits"][real], atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"{name}: logits differ from the reference: {m}")
        greedy_result = compare_greedy(greedy, ref["greedy"], ref["gap"])
        assert greedy_result["mismatch"] is None, f"{name}: greedy tokens differ: {greedy_result}"
        if fixtures and case["size"] == "tiny":
            write_fixture(name, folder, ref)
    return {"family": case["family"], "size": case["size"], "dtype": case["dtype"],
            "shards": case["shards"], "config": case["config"],
            "max_abs_logit_diff": float((logits[real] - ref["logits"][real]).abs().max()),
            "logit_scale": float(ref["logits"][real].abs().max()),
            "greedy_tokens_compared": greedy_result["compared"], "greedy_ties": greedy_result["ties"],
            "greedy_tokens": len(LENGTHS) * NEW_TOKENS,
            "seconds": round(time.perf_counter() - start, 1)}


def write_fixture(name: str, folder: str, ref: dict) -> None:
    """tests/fixtures/models/<name>/: the saved model and reference.safetensors."""
    from safetensors.torch import save_file
    dest = os.path.join(FIXTURES, name)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for file in os.listdir(folder):
        if file.endswith((".json", ".safetensors")) and file != "generation_config.json":
            shutil.copy(os.path.join(folder, file), dest)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(dest, "reference.safetensors"),
              metadata={"made_by": "bench/parity_models.py --fixtures", "transformers": versions()["transformers"]})


def versions() -> dict:
    import transformers
    return {"transformers": transformers.__version__, "torch": torch.__version__}


# published models' config.json values, for --sizes (our GPTConfig's names)
PUBLISHED = {
    "SmolLM2-135M": dict(vocab_size=49152, n_embd=576, mlp_hidden=1536, n_layer=30, n_head=9, n_kv_head=3),
    "SmolLM2-360M": dict(vocab_size=49152, n_embd=960, mlp_hidden=2560, n_layer=32, n_head=15, n_kv_head=5),
    "Qwen2.5-0.5B": dict(vocab_size=151936, n_embd=896, mlp_hidden=4864, n_layer=24, n_head=14,
                         n_kv_head=2, qkv_bias=True),
    "Qwen3-0.6B": dict(vocab_size=151936, n_embd=1024, mlp_hidden=3072, n_layer=28, n_head=16,
                       n_kv_head=8, head_dim=128, qk_norm=True),
    "Llama-3.2-1B": dict(vocab_size=128256, n_embd=2048, mlp_hidden=8192, n_layer=16, n_head=32, n_kv_head=8),
    "Qwen3-1.7B": dict(vocab_size=151936, n_embd=2048, mlp_hidden=6144, n_layer=28, n_head=16,
                       n_kv_head=8, head_dim=128, qk_norm=True),
}


def sizes() -> str:
    """Each published model's parameters in our GPT (built on the meta device: no memory) and
    the bytes they take: float32 weights; full fine-tuning with AdamW (weights, gradients and
    two moments, 16 bytes a parameter); the parameters LoRA rank 16 trains on c_attn, c_proj
    and c_fc. Arithmetic, not a measurement: activations and the other models of a method
    come on top (docs/families.md)."""
    from mingpt_rlhf.machinery.lora import DEFAULT_TARGETS
    from mingpt_rlhf.model import GPT, GPTConfig
    lines = ["| model | parameters (embedding) | float32 weights | full fine-tuning, AdamW | "
             "LoRA rank 16 trains |", "|---|---|---|---|---|"]
    for name, shape in PUBLISHED.items():
        with torch.device("meta"):
            model = GPT(GPTConfig(block_size=1, bias=False, rope_theta=1e6, rms_norm_eps=1e-6,
                                  vocab_multiple=1, **shape))
            params, embedding = model.num_params(), model.transformer.wte.weight.numel()
        # rank x (in + out) for each adapted layer: A is (r, in), B (out, r)
        lora = sum(16 * (m.in_features + m.out_features) for name, m in model.named_modules()
                   if name.endswith(DEFAULT_TARGETS) and isinstance(m, torch.nn.Linear))
        lines.append(f"| {name} | {params / 1e6:,.0f} M ({embedding / 1e6:,.0f} M) | "
                     f"{4 * params / 1e9:.1f} GB | {16 * params / 1e9:.1f} GB | {lora / 1e6:.1f} M |")
    return "\n".join(lines) + "\n\npython bench/parity_models.py --sizes"


def table(results: dict) -> str:
    """The cases of the JSON as a Markdown table."""
    lines = ["| case | family, shape | file | largest logit difference (largest logit) | "
             "greedy tokens equal (ties) |", "|---|---|---|---|---|"]
    for name, r in results["cases"].items():
        lines.append(f"| {name} | {r['family']}, {r['size']} | {r['dtype']}, {r['shards']} "
                     f"file{'s' if r['shards'] > 1 else ''} | {r['max_abs_logit_diff']:.1e} "
                     f"({r['logit_scale']:.2f}) | {r['greedy_tokens_compared']} of "
                     f"{r['greedy_tokens']} ({r['greedy_ties']}) |")
    return "\n".join(lines) + f"\n\n(`{results['command']}`, {results['measured']}, transformers " \
        f"{results['transformers']}, torch {results['torch']}; the table: `python bench/parity_models.py --table`)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true", help="print the JSON's table and exit")
    ap.add_argument("--sizes", action="store_true", help="print published models' sizes and exit")
    ap.add_argument("--cases", nargs="*", choices=list(CASES), default=list(CASES))
    ap.add_argument("--fixtures", action="store_true", help="also rewrite tests/fixtures/models/ (tiny cases)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=RESULTS)
    args = ap.parse_args()
    if args.table or args.sizes:
        if args.table:
            with open(args.json) as f:
                print(table(json.load(f)))
        else:
            print(sizes())
        return
    torch.set_num_threads(args.threads)
    import warnings
    warnings.filterwarnings("ignore")
    results = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)
    results.setdefault("cases", {})
    for name in args.cases:
        result = run_case(name, args.seed, args.fixtures)
        results["cases"][name] = {**result, "measured": measured(ROOT)}
        print(name, json.dumps({k: v for k, v in result.items() if k != "config"}), flush=True)
    results.update(command=" ".join(["bench/peers/trl1/.venv/bin/python bench/parity_models.py",
                                     *sys.argv[1:]]), tolerance={"atol": ATOL, "rtol": RTOL, "tie": TIE},
                   measured=measured(ROOT), **versions())
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(args.json + ".tmp", args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
