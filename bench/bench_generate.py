"""Generation speed: new tokens per second with the KV cache vs a full re-forward per token.

Both loops sample the same way (top-k 50, temperature 1, no EOS, so every row makes exactly
`new_tokens` tokens) from a random-init GPT in eval mode:
- **cached**: `mingpt_rlhf.sampling.generate`, one prompt pass that fills the KV cache, then
  one single-token pass per new token;
- **re-forward**: a plain loop below that runs `model(seq)` on the whole growing sequence each
  step and samples from its last position with `sample_next`, i.e. what decoding costs
  without a cache.

Each is timed `runs` times after `warmup` untimed runs; the median time gives
tokens/s = batch * new_tokens / seconds. Prints one JSON line and writes it to
bench/results/generate.json.

The work per decoding step is small (16 rows of width 128), so timings swing with whatever
else runs on the machine: with torch's default of one thread per core, a core taken by
another process stalls every multi-threaded op. The JSON records the load average before
and after the run; compare runs with a low one, or pin `--threads 1` on a shared machine.

    python bench/bench_generate.py                          # batch 16, prompt 32, 64 new tokens
    python bench/bench_generate.py --batch 4 --runs 5       # any option: see --help
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mingpt_rlhf.machinery.cli import opt, run  # noqa: E402
from mingpt_rlhf.machinery.errors import UserError  # noqa: E402
from mingpt_rlhf.model import GPT, GPTConfig  # noqa: E402
from mingpt_rlhf.sampling import check_sampling_options, generate, sample_next  # noqa: E402


@dataclass
class Config:
    batch: int = opt(16, "prompts sampled together")
    prompt: int = opt(32, "prompt length in tokens (no padding)")
    new_tokens: int = opt(64, "tokens generated per prompt (no EOS, always this many)")
    runs: int = opt(10, "timed runs of each loop; the median is reported")
    warmup: int = opt(2, "untimed runs before timing")
    top_k: int = opt(50, "sample among the k most likely tokens")
    temperature: float = opt(1.0, "sampling temperature")
    vocab_size: int = opt(64, "model vocabulary")
    block_size: int = opt(256, "model context length")
    n_layer: int = opt(4, "transformer blocks")
    n_head: int = opt(4, "attention heads")
    n_embd: int = opt(128, "embedding width")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)")
    seed: int = opt(0, "seed of the model, the prompts and the sampling")
    out: str = opt("bench/results/generate.json", "where the JSON result is written")


@torch.inference_mode()  # the same autograd-free mode as generate(), for a fair comparison
def reforward_generate(model, prompt_ids, new_tokens, temperature, top_k, generator):
    """The no-cache baseline: every step re-runs the model over the whole sequence so far."""
    seq = prompt_ids
    for _ in range(new_tokens):
        logits = model(seq)[:, -1]  # (B, V): only the last position is sampled
        token = sample_next(logits, temperature, top_k, None, generator)  # (B,)
        seq = torch.cat([seq, token[:, None]], dim=1)  # (B, T + 1)
    return seq


def median_seconds(fn, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(cfg: Config) -> dict:
    if min(cfg.batch, cfg.prompt, cfg.new_tokens, cfg.runs) < 1 or cfg.warmup < 0:
        raise UserError("--batch, --prompt, --new_tokens and --runs must be >= 1, "
                        "--warmup >= 0")
    if cfg.prompt + cfg.new_tokens > cfg.block_size:
        raise UserError(f"--prompt {cfg.prompt} + --new_tokens {cfg.new_tokens} exceeds "
                        f"--block_size {cfg.block_size}; lower one or raise --block_size")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"--n_embd {cfg.n_embd} is not a multiple of --n_head {cfg.n_head}")
    try:
        check_sampling_options(cfg.temperature, cfg.top_k)
    except ValueError as e:
        raise UserError(f"{e}; fix --temperature / --top_k") from None
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)

    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                          n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd)).eval()
    prompt_ids = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.prompt))
    generator = torch.Generator().manual_seed(cfg.seed)

    def cached():
        out = generate(model, prompt_ids, max_new_tokens=cfg.new_tokens,
                       temperature=cfg.temperature, top_k=cfg.top_k, eos_token_id=None,
                       generator=generator)
        assert out.responses.shape == (cfg.batch, cfg.new_tokens), out.responses.shape

    def reforward():
        reforward_generate(model, prompt_ids, cfg.new_tokens, cfg.temperature, cfg.top_k,
                           generator)

    new_tokens = cfg.batch * cfg.new_tokens
    load_before = os.getloadavg()[0]
    cached_s = median_seconds(cached, cfg.runs, cfg.warmup)
    reforward_s = median_seconds(reforward, cfg.runs, cfg.warmup)
    result = {
        "bench": "generate",
        "config": asdict(cfg),
        "cached_tokens_per_s": round(new_tokens / cached_s, 1),
        "reforward_tokens_per_s": round(new_tokens / reforward_s, 1),
        "speedup": round(reforward_s / cached_s, 2),
        "cached_s": round(cached_s, 5),
        "reforward_s": round(reforward_s, 5),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after
    }
    os.makedirs(os.path.dirname(cfg.out) or ".", exist_ok=True)
    with open(cfg.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run(main, Config)
