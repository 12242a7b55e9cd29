"""Sampling speed of transformers' `model.generate` on a random-init GPT-2-architecture model,
for comparison with ours (bench/bench_generate.py's cached loop for --shape tiny).

do_sample, temperature 1, top_k 0 (off; --top_k to set one), top_p 1, use_cache (KV cache),
float32, CPU. No early stop: the model's EOS id is one past its vocabulary, so it is never
sampled and every row makes exactly `new_tokens` tokens (checked).

Shapes:
- tiny: bench/bench_generate.py's defaults: vocab 64, 4 layers x 4 heads x 128, 256
        positions; 16 rows, 32-token prompts, 64 new tokens;
- gpt2: GPT-2 small (12 x 12 x 768, vocab 50257, 1024 positions); 8 rows, 64-token prompts,
        32 new tokens.

Each call is timed --reps times after one untimed warm-up; the median gives
tokens/s = rows * new_tokens / seconds. The prefill (a generate of 1 new token: the prompt
pass and one sampled token) is timed the same way.

    bench/peers/.venv/bin/python bench/peers/hf_generate.py --shape tiny
    bench/peers/.venv/bin/python bench/peers/hf_generate.py --shape gpt2 --reps 3

Prints one JSON line, and writes it to --json if given.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, emit, gpt2_model, peak_rss_mb, versions  # noqa: E402

import torch  # noqa: E402

RUNS = {
    "tiny": dict(model="toy", rows=16, prompt_len=32, new_tokens=64, reps=10),
    "gpt2": dict(model="gpt2", rows=8, prompt_len=64, new_tokens=32, reps=3),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(RUNS), default="tiny")
    ap.add_argument("--reps", type=int, default=None, help="timed calls (default 10 tiny, 3 gpt2)")
    ap.add_argument("--top_k", type=int, default=0, help="0 = off (bench_generate.py's default is 50)")
    ap.add_argument("--no_prefill", action="store_true", help="skip timing the 1-new-token generate")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    run = RUNS[args.shape]
    reps = args.reps if args.reps is not None else run["reps"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    shape = SHAPES[run["model"]]
    model = gpt2_model(shape, args.attn).eval()
    prompts = torch.randint(0, shape["vocab_size"], (run["rows"], run["prompt_len"]))
    mask = torch.ones_like(prompts)
    eos = shape["vocab_size"]  # never sampled

    def call(new_tokens):
        out = model.generate(input_ids=prompts, attention_mask=mask, do_sample=True,
                             temperature=1.0, top_k=args.top_k, top_p=1.0, use_cache=True,
                             max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=eos)
        assert out.shape == (run["rows"], run["prompt_len"] + new_tokens), out.shape

    def median_seconds(new_tokens):
        call(new_tokens)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            call(new_tokens)
            times.append(time.perf_counter() - t)
        return statistics.median(times), times

    load_before = os.getloadavg()[0]
    gen_s, gen_all = median_seconds(run["new_tokens"])
    result = {
        "bench": "hf_generate",
        "shape": args.shape,
        "sec_per_generate": round(gen_s, 5),
        "tokens_per_s": round(run["rows"] * run["new_tokens"] / gen_s, 1),
        "sec_all": [round(t, 5) for t in gen_all],
    }
    if not args.no_prefill:
        pre_s, _ = median_seconds(1)
        # the rest: the new_tokens - 1 single-token steps after the prompt pass
        decode_s = max(gen_s - pre_s, 1e-9)
        result.update(prefill_s=round(pre_s, 5),
                      decode_tokens_per_s=round(run["rows"] * (run["new_tokens"] - 1) / decode_s, 1))
    result.update(rows=run["rows"], prompt_len=run["prompt_len"], new_tokens=run["new_tokens"],
                  reps=reps, top_k=args.top_k, attn=args.attn, model=shape,
                  peak_rss_mb=peak_rss_mb(), threads=torch.get_num_threads(), **versions(),
                  load_avg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)])
    emit(result, args.json)


if __name__ == "__main__":
    main()
