"""Ours against the libraries our users would otherwise pick, measured side by side in one run:
trl 0.11.4's PPOTrainer and transformers 4.45.2's generate (their venv: bench/peers/).

    bash bench/peers/setup.sh                    # once: bench/peers/.venv (trl, transformers)
    python bench/vs_peers.py                     # every part, 3 rounds
    python bench/vs_peers.py --part toy gpt2 --rounds 5

Parts (each the same shapes, batch, lengths, sampling and thread count on both sides):
- toy:        one PPO iteration of bench/ppo_speed.py's config (vocab 64, 4 x 4 x 128; 64
              prompts of 16 tokens, 32 new tokens, 4 epochs x 4 minibatches of 16, shared
              critic, plain reward function);
- gpt2:       one PPO iteration at GPT-2-small shape (12 x 12 x 768, 50,257 ids): 8 prompts of
              64 tokens, 32 new tokens, 1 epoch of 2 minibatches, shared critic, no ptx. Ours
              runs train_ppo.main from an SFT and a reward-model checkpoint (both with their
              AdamW state, as train_sft.py and train_rm.py write them) and scores with the
              GPT-2-size reward model; trl scores with a plain function;
- gpt2_lora:  the same with LoRA rank 16 on c_attn, c_proj, c_fc (trl: peft, the reference
              is the model with its adapters off, as ours);
- gen_tiny, gen_gpt2: sampling only (plain sampling, temperature 1, no EOS): 16 rows of 32 +
              64 tokens on the tiny model; 8 rows of 64 + 32 tokens at GPT-2 shape.
Seconds are medians over each process's measured iterations (after a warm-up iteration);
peak memory is the whole process's peak resident set (VmHWM), loading included, under glibc's
default allocator. Each round runs ours, then the peer, each in a fresh process, so a slow
minute of the machine hits both; the ratios are per round, and the JSON keeps every round.
Gradient clipping at 1.0 on both sides (trl's default is none).

For the GPT-2 parts, each of our phases is written beside its floor on this machine: the
matrix multiplies' FLOPs at the GEMM rate measured here at the same shapes (prefill, score,
learn), and the bytes of weights read per decoding step at the measured memory bandwidth
(decode): no implementation can be faster than those here.

Writes bench/results/vs_peers.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_PY = os.path.join(ROOT, "bench", "peers", ".venv", "bin", "python")
RESULTS = os.path.join(ROOT, "bench", "results", "vs_peers.json")
FIXTURES = os.path.join(ROOT, "out", "vs_peers")
GPT2 = dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, rows=8, prompt=64, new=32)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


# ----------------------------------------------------------------------------- our side
def ours_toy(threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from ppo_speed import measure
    result = measure("shared", "float32", iters=5, warmup=1, floor=True)
    return {**result, "peak_rss_mb": peak_rss_mb()}


def gpt2_fixtures() -> dict:
    """GPT-2-shaped weights and BPE (bench/gpt2_scale.py), then an SFT and a reward-model
    checkpoint trained for a step from them, with their optimizer state (once)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from gpt2_scale import prepare
    folder = os.path.join(ROOT, "out", "gpt2_scale", "small")
    prepare(folder, "small", "cpu")
    data = os.path.join(folder, "cpu")
    sft, rm = os.path.join(FIXTURES, "sft"), os.path.join(FIXTURES, "rm")
    if not os.path.exists(os.path.join(rm, "ckpt.pt")):
        os.environ["MINGPT_RLHF_PLOT"] = "0"
        import train_rm
        import train_sft
        train_sft.main(train_sft.Config(init_from=folder, data=os.path.join(data, "demos.jsonl"),
                                        out_dir=sft, batch_size=2, max_iters=1, warmup_iters=0,
                                        eval_interval=1000, eval_prompts=0))
        cut = os.path.join(FIXTURES, "prefs.jsonl")
        with open(os.path.join(data, "prefs.jsonl")) as src, open(cut, "w") as dst:
            dst.writelines(line for i, line in enumerate(src) if i < 8)
        train_rm.main(train_rm.Config(sft_dir=sft, data=cut, out_dir=rm, batch_size=2, epochs=1,
                                      warmup_iters=0, eval_interval=1000, norm_samples=0))
    return {"sft": sft, "rm": rm, "prompts": os.path.join(data, "prompts.jsonl")}


def ours_gpt2(threads: int, lora_rank: int) -> dict:
    """train_ppo.main at GPT-2 shape: seconds of each PPOTrainer.step, the process's peak."""
    import torch
    torch.set_num_threads(threads)
    os.environ["MINGPT_RLHF_PLOT"] = "0"
    sys.path.insert(0, ROOT)
    fx = gpt2_fixtures()
    import train_ppo
    from mingpt_rlhf.ppo_trainer import PPOTrainer
    steps, real_step = [], PPOTrainer.step

    def timed_step(self, *args, **kwargs):
        start = time.perf_counter()
        out = real_step(self, *args, **kwargs)
        steps.append({"sec_per_iter": time.perf_counter() - start,
                      **{k: out[1][k] for k in ("t_generate", "t_score", "t_learn", "resp_len")}})
        return out
    PPOTrainer.step = timed_step
    warmup, iters = 1, 3
    out_dir = tempfile.mkdtemp(prefix="vs_peers_")
    train_ppo.main(train_ppo.Config(
        sft_dir=fx["sft"], rm_dir=fx["rm"], prompts=fx["prompts"], out_dir=out_dir,
        max_iters=warmup + iters, rollout_batch_size=GPT2["rows"], minibatch_size=GPT2["rows"] // 2,
        ppo_epochs=1, max_new_tokens=GPT2["new"], critic="shared", ptx_coef=0.0, target_kl=0.0,
        kl_coef=0.05, adaptive_kl=False, actor_lr=5e-5, eval_prompts=2, eval_interval=1000,
        lora_rank=lora_rank, device="cpu", dtype="float32"))
    measured = steps[warmup:]
    result = {k: round(statistics.median(s[k] for s in measured), 4) for k in measured[0]}
    result.update(sec_per_iter_all=[round(s["sec_per_iter"], 3) for s in measured],
                  peak_rss_mb=round(peak_rss_mb(), 1), lora_rank=lora_rank,
                  threads=torch.get_num_threads())
    return result


def ours_generate(threads: int, shape: str) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, ROOT)
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.sampling import generate
    if shape == "tiny":
        config, rows, prompt, new, reps = GPTConfig(vocab_size=64, block_size=256, n_layer=4,
                                                    n_head=4, n_embd=128), 16, 32, 64, 10
    else:
        config = GPTConfig(vocab_size=GPT2["vocab"], block_size=1024, n_layer=12, n_head=12, n_embd=768)
        rows, prompt, new, reps = GPT2["rows"], GPT2["prompt"], GPT2["new"], 3
    torch.manual_seed(0)
    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (rows, prompt))
    g = torch.Generator().manual_seed(0)

    def seconds(n):
        generate(model, ids, max_new_tokens=n, generator=g)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = generate(model, ids, max_new_tokens=n, generator=g)
            times.append(time.perf_counter() - t)
            assert out.responses.shape == (rows, n)
        return statistics.median(times)
    total, prefill = seconds(new), seconds(1)
    return {"sec_per_generate": round(total, 5), "tokens_per_s": round(rows * new / total, 1),
            "prefill_s": round(prefill, 5), "decode_s": round(total - prefill, 5),
            "peak_rss_mb": round(peak_rss_mb(), 1), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- floors
def machine_rates(threads: int) -> dict:
    """This machine's float32 GEMM rate at GPT-2's linear shapes (GFLOP/s, for M = the tokens
    of one minibatch and of one prompt batch) and its memory read bandwidth (GB/s)."""
    import torch
    torch.set_num_threads(threads)
    C = GPT2["n_embd"]

    def best(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)
    rates = {}
    for name, M in (("learn", GPT2["rows"] // 2 * (GPT2["prompt"] + GPT2["new"])),
                    ("prefill", GPT2["rows"] * GPT2["prompt"])):
        mats = [(torch.randn(M, i), torch.randn(o, i), torch.randn(M, o))
                for i, o in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))]

        def run():
            for x, w, dy in mats:
                x @ w.t(), dy @ w, dy.t() @ x
        flop = sum(3 * 2 * M * w.shape[0] * w.shape[1] for _, w, _ in mats)
        rates[f"gemm_gflops_{name}"] = round(flop / best(run) / 1e9, 1)
    big = torch.randn(64 * 2**20)  # 256 MB: far past the caches
    rates["read_gb_per_s"] = round(big.numel() * 4 / best(lambda: big.sum()) / 1e9, 1)
    return rates


def gpt2_floors(rates: dict, lora: bool) -> dict:
    """Seconds each phase of the gpt2 part would take doing only its matrix multiplies at the
    measured GEMM rate (decode: only reading the weights at the measured bandwidth)."""
    C, L, V = GPT2["n_embd"], GPT2["n_layer"], 50304  # the padded vocabulary ours computes
    linear = L * 12 * C * C                           # weights of the blocks' four Linear layers
    R, T, N = GPT2["rows"], GPT2["prompt"], GPT2["new"]
    tokens = R * (T + N)
    gemm = rates["gemm_gflops_learn"] * 1e9
    # backward: input gradients always, weight gradients only of what trains (LoRA: adapters)
    backward = 2 if lora else 4
    return {
        "prefill": round(2 * linear * R * T / (rates["gemm_gflops_prefill"] * 1e9), 3),
        "decode": round((N - 1) * (linear + V * C) * 4 / (rates["read_gb_per_s"] * 1e9), 3),
        # reference (trunk + output layer at response positions) and reward model (trunk)
        "score": round((2 * 2 * linear * tokens + 2 * V * C * R * N) / gemm, 3),
        "learn": round(((2 + backward) * linear * tokens + (2 + backward) * V * C * R * N) / gemm, 3),
    }


# ----------------------------------------------------------------------------- the runs
PARTS = {  # part: (our worker's arguments, the peer's command-line arguments)
    "toy": (["toy"], ["trl_ppo.py", "--shape", "toy", "--max_grad_norm", "1.0"]),
    "gpt2": (["gpt2", "0"], ["trl_ppo.py", "--shape", "gpt2", "--max_grad_norm", "1.0"]),
    "gpt2_lora": (["gpt2", "16"], ["trl_ppo.py", "--shape", "gpt2", "--lora_rank", "16",
                                   "--max_grad_norm", "1.0"]),
    "gen_tiny": (["generate", "tiny"], ["hf_generate.py", "--shape", "tiny"]),
    "gen_gpt2": (["generate", "gpt2"], ["hf_generate.py", "--shape", "gpt2"]),
}


def last_json(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{' '.join(cmd)} failed: {' | '.join(tail)}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="*", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--rounds", type=int, default=3, help="ours-then-peer rounds per part")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        kind, *rest = args.worker
        result = (ours_toy(args.threads) if kind == "toy" else
                  ours_gpt2(args.threads, int(rest[0])) if kind == "gpt2" else
                  ours_generate(args.threads, rest[0]) if kind == "generate" else
                  machine_rates(args.threads))
        print(json.dumps(result))
        return
    if not os.path.exists(PEER_PY):
        raise SystemExit("no bench/peers/.venv: run `bash bench/peers/setup.sh` first")
    results = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            results = json.load(f)
    me = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads), "--worker"]
    if any(p.startswith("gpt2") for p in args.part):
        gpt2_fixtures()  # built once, not timed
    rates = last_json(me + ["rates"])
    print("machine:", json.dumps(rates), flush=True)
    for part in args.part:
        ours_args, peer_args = PARTS[part]
        rounds = []
        for r in range(args.rounds):
            ours = last_json(me + ours_args)
            peer = last_json([PEER_PY, os.path.join(ROOT, "bench", "peers", peer_args[0]),
                              "--threads", str(args.threads), *peer_args[1:]])
            key = "sec_per_generate" if part.startswith("gen") else "sec_per_iter"
            rounds.append({"ours": ours, "peer": peer,
                           "speedup": round(peer[key] / ours[key], 3),
                           "memory_ratio": round(peer["peak_rss_mb"] / ours["peak_rss_mb"], 3)})
            print(json.dumps({"part": part, "round": r, "ours_s": ours[key], "peer_s": peer[key],
                              "speedup": rounds[-1]["speedup"], "ours_peak_mb": ours["peak_rss_mb"],
                              "peer_peak_mb": peer["peak_rss_mb"]}), flush=True)
        speedups = [x["speedup"] for x in rounds]
        memory = [x["memory_ratio"] for x in rounds]
        summary = {"speedup_median": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
                   "memory_ratio_median": statistics.median(memory),
                   "ours_peak_mb": statistics.median(x["ours"]["peak_rss_mb"] for x in rounds),
                   "peer_peak_mb": statistics.median(x["peer"]["peak_rss_mb"] for x in rounds)}
        if part == "gen_gpt2":
            floors = gpt2_floors(rates, lora=False)
            summary["floors_s"] = {k: floors[k] for k in ("prefill", "decode")}
            summary["ours_phases_s"] = {k: statistics.median(x["ours"][k] for x in rounds)
                                        for k in ("prefill_s", "decode_s")}
        if part.startswith("gpt2"):
            summary["floors_s"] = gpt2_floors(rates, lora=part == "gpt2_lora")
            summary["ours_phases_s"] = {k: statistics.median(x["ours"][k] for x in rounds)
                                        for k in ("t_generate", "t_score", "t_learn")}
        results[part] = {"summary": summary, "rounds": rounds}
        print(part, json.dumps(summary), flush=True)
    import torch
    results["machine"] = {**rates, "threads": args.threads, "torch": torch.__version__,
                          "cpu": os.cpu_count()}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
