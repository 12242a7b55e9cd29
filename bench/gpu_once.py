"""One GPU, once: the GPT-2 path measured end to end inside a short lease, in few commands.

A GPU may be lent for a few minutes, with no network and its own torch. This script needs
nothing but the working tree (run it with PYTHONPATH=. from the repository root) and writes
one JSON per part into --out, rewritten as each piece ends, so a run cut short keeps what
finished. `--part timing` (about 5 minutes on an H200):

1. The card: its name, torch's version, a bf16 8192^3 matrix product's TFLOP/s and a
   device-to-device copy's bandwidth (both measured), and the published dense bf16 peak and
   memory bandwidth that the ratios below are taken against.
2. GPT-2 small's shape with random weights in GPT-2's layout (bench/gpt2_scale.py writes
   them; nothing is downloaded), in bfloat16, with full fine-tuning and with
   `--lora_rank 16`: SFT and RM steps (the mean of steps 2-4) at the recipe's batch (16) and
   at a fuller one (64 for SFT, 32 pairs for RM), PPO and GRPO iterations (the third of
   three) with seconds per phase, and peak GPU memory (`torch.cuda.max_memory_allocated`).
   Model-FLOPs utilisation of SFT and RM with full fine-tuning: model FLOPs per step /
   seconds / the card's peak; model FLOPs = 6 per weight of the blocks' matrices per token,
   plus the attention's two products (12 x layers x width x sequence length per token,
   without the causal half, as PaLM's appendix counts them), plus, for SFT, 6 x 50,257 x
   width per response token for the output layer (it is applied only where a token is
   scored; the RM reads one scalar per sequence).
3. Decoding: new tokens per second of `sampling.generate` at batch 32 and 256 (prompt 256
   tokens, 64 new, no EOS), the actor as PPO samples with it (float32 weights under bf16
   autocast) and a frozen copy held in bf16; one decoding step's time is
   (time of 64 new tokens - time of 1) / 63. Its bound: the bytes one step must read (the
   bf16 block weights, the float32 output layer, the bf16 KV cache at the mean length) over
   the card's bandwidth, measured and published.
5. GPT-2 medium's shape, a row each for SFT and PPO, if time is left.

`--part checks` (about 6 minutes): 4. `pytest -m gpu` and the built-in pipeline at its
defaults (`train_sft.py`, `train_rm.py`, `train_ppo.py`; on CUDA the default dtype is bf16),
side by side; neither is timed. `--part profile` (1 minute): torch's profiler over SFT and
RM steps at the fuller batch and over decoding: the device's busy time, the kernels launched
and the host's waits per step, and the top kernels (tables in OUT/*_profile.txt).

    PYTHONPATH=. python bench/gpu_once.py --part timing --out "$OUT"    # on the GPU machine
    PYTHONPATH=. python bench/gpu_once.py --part checks --out "$OUT"
    python bench/gpu_once.py --device cpu --tiny --part timing --out /tmp/g   # CPU dry runs

Then copy OUT/gpu_<part>.json to bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpt2_scale  # noqa: E402

# published dense (no sparsity) bf16 tensor-core peak, TFLOP/s, and memory bandwidth, TB/s
CARDS = {"H200": (989.4, 4.8), "H100 PCIe": (756.0, 2.0), "H100 NVL": (835.0, 3.9),
         "H100": (989.4, 3.35), "A100": (312.0, 2.0)}


class Run:
    def __init__(self, args):
        self.args, self.start = args, time.time()
        self.path = os.path.join(args.out, f"gpu_{args.part}.json")
        self.result = {"command": "PYTHONPATH=. python bench/gpu_once.py " + " ".join(sys.argv[1:]),
                       "date": time.strftime("%Y-%m-%d"), "parts_done": []}

    def left(self) -> float:
        return self.args.budget - (time.time() - self.start)

    def save(self, part: str):
        self.result["parts_done"].append(part)
        self.result["seconds_so_far"] = round(time.time() - self.start, 1)
        with open(self.path + ".part", "w") as f:
            json.dump(self.result, f, indent=1)
        os.replace(self.path + ".part", self.path)
        print(f"[{self.result['seconds_so_far']:.0f} s] {part} done", flush=True)


def sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- 1. the card
def the_card(run: Run) -> None:
    import torch
    dev = run.args.device
    card = {"torch": torch.__version__, "device": dev}
    n = 1024 if run.args.tiny else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(dev)
    card["matmul_bf16_tflops"] = round(10 * 2 * n ** 3 / (time.perf_counter() - t) / 1e12, 1)
    x = torch.empty(2 ** (26 if run.args.tiny else 30), dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(dev)
    card["copy_tb_s"] = round(10 * 2 * x.numel() / (time.perf_counter() - t) / 1e12, 2)  # read + write
    if dev == "cuda":
        name = torch.cuda.get_device_name()
        card["name"] = name
        card["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        card["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)
        for key, (tflops, tbs) in CARDS.items():
            if key in name:
                card.update(peak_bf16_tflops=tflops, peak_tb_s=tbs, peak_source=f"published, {key}")
                break
    del a, b, x, y
    run.result["card"] = card
    run.save("card")


# ----------------------------------------------------------------------------- 2. GPT-2 rows
def worker_row(run: Run, folder, batch, stage, options, timeout, **extra) -> dict:
    spec = dict(stage=stage, options=options, code=ROOT, folder=folder, batch=batch,
                device=run.args.device, threads=0, mmap_threshold=0,
                iters=3, steps=6, **extra)
    cmd = [sys.executable, os.path.join(ROOT, "bench", "gpt2_scale.py"), "--worker", json.dumps(spec)]
    t = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    row = {"wall_s": round(time.time() - t, 1)}
    if proc.returncode != 0:
        row["error"] = proc.stderr.strip()[-1500:] or "failed"
    else:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return row


def model_flops(stage, shape, batch) -> float:
    """Model FLOPs of one SFT or RM step (forward and backward): 6 per weight of the blocks'
    matrices per token, the attention's products, and SFT's output layer at the positions it
    is applied (the response's tokens, logprobs.py), not at the prompt's."""
    s, b = gpt2_scale.SHAPES[shape], gpt2_scale.BATCHES[batch]
    L, d, T, V = s["n_layer"], s["n_embd"], b["prompt"] + b["new"], 50257
    rows = b["sft_batch"] if stage == "sft" else 2 * b["rm_batch"]
    blocks = (6 * 12 * L * d * d + 12 * L * d * T) * rows * T
    return blocks + (6 * V * d * rows * b["new"] if stage == "sft" else 0)


def row_name(stage, shape, batch, options) -> str:
    """e.g. sft_full_recipe, grpo_lora_recipe, medium_ppo_full_recipe."""
    name = f"{options.get('algo', stage)}_{'lora' if options.get('lora_rank') else 'full'}_{batch}"
    return name if shape in ("small", "tiny") else f"{shape}_{name}"


def add_utilisation(row: dict, card: dict) -> None:
    """Model FLOPs per second and their share of the card's peak, for full fine-tuning's SFT
    and RM rows (LoRA skips most weight gradients, so 6 per weight does not hold)."""
    if row["stage"] in ("sft", "rm") and not row.get("lora_rank") and "seconds" in row:
        flops = model_flops(row["stage"], row["shape"], row["batch"])
        row["model_tflop_per_step"] = round(flops / 1e12, 3)
        row["achieved_tflops"] = round(flops / row["seconds"] / 1e12, 1)
        if "peak_bf16_tflops" in card:
            row["mfu"] = round(flops / row["seconds"] / 1e12 / card["peak_bf16_tflops"], 3)


def gpt2_rows(run: Run, shape: str, plan, part: str) -> None:
    folder = os.path.join(run.args.work, shape)
    rows = run.result.setdefault("gpt2", {})
    for stage, batch, options in plan:
        name = row_name(stage, shape, batch, options)
        if run.left() < 40:
            rows[name] = {"skipped": "no time left"}
            continue
        gpt2_scale.prepare(folder, shape, batch)
        row = {"stage": stage, "shape": shape, "batch": batch, **options,
               **worker_row(run, folder, batch, stage, options, timeout=min(150, run.left() - 20))}
        add_utilisation(row, run.result.get("card", {}))
        print(json.dumps(row), flush=True)
        rows[name] = row
        run.save(f"{part}: {stage} {batch} {options}")


# ----------------------------------------------------------------------------- 3. decoding
def decoding(run: Run, shape: str) -> None:
    import torch
    from mingpt_rlhf.machinery.checkpoint import load_policy
    from mingpt_rlhf.machinery.runtime import autocast, hold_frozen_in
    from mingpt_rlhf.sampling import generate
    dev = torch.device(run.args.device)
    folder = os.path.join(run.args.work, shape)
    policy = load_policy("", folder)[0].to(dev)
    cfg = policy.config
    L, d, V = cfg.n_layer, cfg.n_embd, cfg.vocab_size
    prompt, new = (32, 16) if run.args.tiny else (256, 64)
    out = {}
    for held in ("float32 actor", "bf16 frozen copy"):
        if held == "bf16 frozen copy":
            hold_frozen_in(policy, torch.bfloat16)
        for batch in ((4, 16) if run.args.tiny else (32, 256)):
            if run.left() < 30:
                break
            g = torch.Generator(device=dev).manual_seed(0)
            ids = torch.randint(0, V - 1, (batch, prompt), device=dev, generator=g)

            def timed(n_new):
                times = []
                for i in range(4):  # one warm-up, three timed
                    sync(run.args.device)
                    t = time.perf_counter()
                    with autocast(dev, torch.bfloat16):
                        generate(policy, ids, max_new_tokens=n_new, top_k=None, generator=g)
                    sync(run.args.device)
                    if i:
                        times.append(time.perf_counter() - t)
                return statistics.median(times)
            t_one, t_all = timed(1), timed(new)
            step = (t_all - t_one) / (new - 1)
            kv_bytes = 2 * L * batch * (prompt + new / 2) * d * 2
            weight_bytes = 12 * L * d * d * 2 + V * d * 4
            row = {"held": held, "batch": batch, "prompt": prompt, "new": new,
                   "seconds_all": round(t_all, 4), "seconds_prompt_pass": round(t_one, 4),
                   "ms_per_step": round(1e3 * step, 3), "tokens_per_s": round(batch / step, 1),
                   "bytes_per_step_mb": round((kv_bytes + weight_bytes) / 1e6, 1)}
            card = run.result.get("card", {})
            for key, tbs in (("measured_copy", card.get("copy_tb_s")), ("published", card.get("peak_tb_s"))):
                if tbs:
                    bound = (kv_bytes + weight_bytes) / (tbs * 1e12)
                    row[f"bound_ms_{key}"] = round(1e3 * bound, 4)
                    row[f"x_bound_{key}"] = round(step / bound, 1)
            print(json.dumps(row), flush=True)
            out[f"{held.split()[1]}_b{batch}"] = row
    run.result.setdefault("decoding", {})[shape] = out
    run.save(f"decoding {shape}")


# ----------------------------------------------------------------------------- 4. tests, pipeline
def tests_and_pipeline(run: Run) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    if run.args.device == "cpu":
        env["MINGPT_RLHF_GPU_TESTS_ON"] = "cpu"
    tiny = run.args.tiny
    stages = [["train_sft.py"] + (["--max_iters", "6", "--eval_interval", "3"] if tiny else []),
              ["train_rm.py"] + (["--n_pairs", "256"] if tiny else []),
              ["train_ppo.py"] + (["--max_iters", "2", "--eval_interval", "1"] if tiny else [])]
    out_root = os.path.join(run.args.work, "pipeline")
    script = " && ".join(
        f"{sys.executable} {' '.join(s)} --out_dir {out_root}/{s[0][6:-3]}"
        + (f" --sft_dir {out_root}/sft" if s[0] != "train_sft.py" else "")
        + (f" --rm_dir {out_root}/rm" if s[0] == "train_ppo.py" else "")
        for s in stages)
    log_t = open(os.path.join(run.args.out, "pytest_gpu.log"), "w")
    log_p = open(os.path.join(run.args.out, "pipeline.log"), "w")
    t0 = time.time()
    tests = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py",
                              "-q", "-p", "no:cacheprovider", "-rfEs"], cwd=ROOT, env=env,
                             stdout=log_t, stderr=subprocess.STDOUT)
    pipe = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=log_p,
                            stderr=subprocess.STDOUT)
    result = {}
    for name, proc in (("pytest_gpu", tests), ("pipeline", pipe)):
        try:
            rc = proc.wait(timeout=max(5, run.left() - 15))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed at the budget"
        result[name] = {"rc": rc, "wall_s": round(time.time() - t0, 1)}
    log_t.close()
    log_p.close()
    with open(os.path.join(run.args.out, "pytest_gpu.log")) as f:
        lines = f.read().splitlines()
    result["pytest_gpu"]["summary"] = [line for line in lines if " passed" in line or " failed" in line
                                       or line.startswith(("FAILED", "ERROR", "SKIPPED"))][-20:]
    with open(os.path.join(run.args.out, "pipeline.log")) as f:
        text = f.read()
    bar = re.compile(r"\d+/\d+ \[")  # tqdm's progress lines
    result["pipeline"]["tail"] = [line for line in text.replace("\r", "\n").splitlines()
                                  if line.strip() and not bar.search(line)][-40:]
    metrics = os.path.join(out_root, "ppo", "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        finals = [r for r in rows if r.get("final")]
        evals = [r for r in rows if "gold" in r]
        result["pipeline"]["first_eval"] = evals[0] if evals else None
        result["pipeline"]["final"] = finals[-1] if finals else None
    run.result.update(result)
    run.save("tests and pipeline")


# ----------------------------------------------------------------------------- --profile
def profiles(run: Run) -> None:
    """Where the time of an SFT step, an RM step and a decoding step goes: torch's profiler
    tables in OUT (*_profile.txt) and, per step, the device's busy time, the kernels launched
    and the host's waits for the device, against the step's wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from mingpt_rlhf.machinery.checkpoint import load_policy
    from mingpt_rlhf.machinery.runtime import autocast
    from mingpt_rlhf.sampling import generate
    shape, batch = ("tiny", "cpu") if run.args.tiny else ("small", "gpu")
    folder = os.path.join(run.args.work, shape)
    gpt2_scale.prepare(folder, shape, batch)
    out = run.result.setdefault("profiles", {})
    for stage in ("sft", "rm"):
        row = worker_row(run, folder, batch, stage, dict(dtype="bfloat16"), timeout=120,
                         profile=os.path.join(run.args.out, f"{stage}_profile.txt"))
        print(json.dumps(row), flush=True)
        out[stage] = {"batch": batch, **row}
        run.save(f"profile {stage}")
    dev = torch.device(run.args.device)
    policy = load_policy("", folder)[0].to(dev)
    n_batch, prompt, new = (4, 32, 8) if run.args.tiny else (32, 256, 32)
    ids = torch.randint(0, policy.config.vocab_size - 1, (n_batch, prompt), device=dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with autocast(dev, torch.bfloat16):
        generate(policy, ids, max_new_tokens=new, top_k=None)  # warm-up
        sync(run.args.device)
        with profile(activities=activities) as prof:
            t = time.perf_counter()
            generate(policy, ids, max_new_tokens=new, top_k=None)
            sync(run.args.device)
            wall = time.perf_counter() - t
    path = os.path.join(run.args.out, "decode_profile.txt")
    out["decode"] = {"batch": n_batch, "prompt": prompt, "new": new,
                     "wall_ms_per_token": round(1e3 * wall / new, 3),
                     **gpt2_scale.profile_summary(prof, new, path)}
    print(json.dumps(out["decode"]), flush=True)
    run.save("profile decode")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="timing", choices=["timing", "checks", "profile"],
                    help="timing: parts 1-3 and 5 (gpu_timing.json, about 5 min on an H200); "
                         "checks: part 4 (gpu_checks.json, about 6 min); profile: where the "
                         "time of an SFT, an RM and a decoding step goes (gpu_profile.json, 1 min)")
    ap.add_argument("--out", default="out/gpu_once", help="folder for the JSON and the logs")
    ap.add_argument("--work", default="/tmp/gpu_once", help="folder for the GPT-2 fixtures and runs")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a tiny GPT-2 shape and batch: a CPU dry run")
    ap.add_argument("--budget", type=float, default=420, help="seconds for the part; what "
                    "would not fit is skipped and marked so")
    args = ap.parse_args()
    if args.tiny:
        gpt2_scale.SHAPES["tiny"] = dict(n_layer=2, n_head=2, n_embd=64)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    run = Run(args)
    if args.part == "profile":
        profiles(run)
    elif args.part == "checks":
        tests_and_pipeline(run)
    else:
        the_card(run)
        shape, big, small = ("tiny", "cpu", "cpu") if args.tiny else ("small", "gpu", "recipe")
        bf16 = dict(dtype="bfloat16")
        lora = dict(dtype="bfloat16", lora_rank=16)
        gpt2_rows(run, shape, [("sft", small, bf16), ("sft", big, bf16), ("sft", small, lora),
                               ("rm", small, bf16), ("rm", big, bf16), ("rm", small, lora),
                               ("ppo", small, bf16), ("ppo", small, lora),
                               ("ppo", small, dict(bf16, algo="grpo")),
                               ("ppo", small, dict(lora, algo="grpo"))], "gpt2 " + shape)
        if run.left() > 60:
            decoding(run, shape)
        if run.left() > 90 and not args.tiny:
            gpt2_rows(run, "medium", [("sft", small, bf16), ("ppo", small, bf16)], "gpt2 medium")
    print(f"wrote {run.path} in {time.time() - run.start:.0f} s")


if __name__ == "__main__":
    main()
