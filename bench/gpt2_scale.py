"""GPT-2 scale: seconds and peak memory of one PPO iteration, one SFT step and one RM step.

What a user's `--init_from gpt2` run does, with no download: a GPT-2-shaped model (small:
12 layers x 768, medium: 24 x 1024; vocabulary 50,257, block 1024) with random weights is
written in GPT-2's published safetensors layout, next to a 50,257-token byte-level BPE
(vocab.json + merges.txt of synthetic merges), and the scripts load it through
`GPT.from_pretrained` / `BPETokenizer.from_pretrained` exactly as they load the real files.
Prompts, demonstrations and preference pairs are synthetic text cut to a fixed token length.

Each measurement runs in a fresh process and calls the script's own `main` (train_ppo,
train_sft, train_rm) for one iteration (PPO) or three steps (SFT, RM). We time and measure the
iteration itself, not the loading or the evals around it:
- PPO: `PPOTrainer.step` (generate / score / learn from its own timers; peak memory of
  making the experience and of learning from it, and the larger of the two);
- SFT, RM: the second optimizer step (the first one allocates the optimizer state).
Peak memory: on the CPU the process's peak resident set size (Linux VmHWM, reset just before
the measured part through /proc/self/clear_refs); on a GPU `torch.cuda.max_memory_allocated`
(reset likewise).

`--before REV` runs the same measurements on the code of git revision REV (extracted into a
temporary folder), so a change's saving is a ratio measured in one run. Options the old code
does not have (LoRA, --grad_checkpoint) are skipped there.

    python bench/gpt2_scale.py                          # CPU-sized batch, gpt2-small shape
    python bench/gpt2_scale.py --batch recipe           # the PPO batch of docs/gpt2.md's one-GPU recipe
    python bench/gpt2_scale.py --before 933198f         # and the same at that revision
    python bench/gpt2_scale.py --device cuda --shape medium --batch recipe

Writes bench/results/gpt2_scale_<device>_<shape>_<batch>.json and prints each row.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"small": dict(n_layer=12, n_head=12, n_embd=768),
          "medium": dict(n_layer=24, n_head=16, n_embd=1024),
          # Qwen3-0.6B's shape in Qwen3's layout (bench/vs_peers.py writes it), and a tiny one
          "qwen3": dict(family="qwen3", size="qwen3"),
          "qwen3_tiny": dict(family="qwen3", size="qwen3_tiny")}
# prompt tokens, response tokens, PPO rollouts / minibatch / epochs, SFT and RM batch
BATCHES = {
    "cpu": dict(prompt=64, new=32, rollouts=8, minibatch=4, epochs=1, sft_batch=8, rm_batch=8),
    "recipe": dict(prompt=256, new=64, rollouts=32, minibatch=8, epochs=1, sft_batch=16, rm_batch=16),
    # a GPU's fuller batch (bench/gpu_once.py): 64 x 320 tokens per SFT step
    "gpu": dict(prompt=256, new=64, rollouts=64, minibatch=16, epochs=1, sft_batch=64, rm_batch=32),
    # a dry run's (bench/gpu_once.py --tiny)
    "tiny": dict(prompt=16, new=8, rollouts=8, minibatch=4, epochs=1, sft_batch=4, rm_batch=4),
}


# ----------------------------------------------------------------------------- fixtures
def write_bpe_files(folder: str, n_merges: int = 50000) -> None:
    """A GPT-2-sized byte-level BPE: 256 byte symbols, `n_merges` merges of two byte symbols
    each, then <|endoftext|>: 50,257 ids, like GPT-2's. Past the 65,536 pairs of bytes (Qwen's
    ~151,670 ids), each further merge joins one of those pairs and a third byte."""
    sys.path.insert(0, ROOT)
    from mingpt_rlhf.machinery.bpe import EOT, byte_to_unicode
    base = list(byte_to_unicode().values())
    merges = [(base[i % 256], base[i // 256]) for i in range(min(n_merges, 256 * 256))]
    merges += [(base[k // 256 % 256] + base[k // 65536], base[k % 256])
               for k in range(n_merges - len(merges))]
    tokens = base + [a + b for a, b in merges]
    encoder = {t: i for i, t in enumerate(tokens)}
    encoder[EOT] = len(encoder)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def texts_of_length(tok, n_tokens: int, count: int, seed: int) -> list[str]:
    """`count` texts of random lowercase words whose encoding is `n_tokens` long (+-1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                 for _ in range(rng.randint(2, 9))) for _ in range(n_tokens))
        out.append(tok.decode(tok.encode(words)[:n_tokens]).strip())
    return out


def qwen3_shape(shape: str) -> dict:
    """vs_peers's dict of a Qwen3 shape of SHAPES (layers, widths, heads, vocabulary)."""
    import vs_peers
    return vs_peers.QWEN3 if SHAPES[shape]["size"] == "qwen3" else vs_peers.QWEN3_TINY


def prepare(folder: str, shape: str, batch: str) -> None:
    """The checkpoint (GPT-2's layout, or a Qwen3 folder), tokenizer files and JSONL data in
    `folder` (once)."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_pretrained import write_gpt2_checkpoint
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    if SHAPES[shape].get("family") == "qwen3":
        import vs_peers  # its folder: config.json, random weights, a BPE of Qwen3's size
        vs_peers.write_qwen3_fixture(folder, qwen3_shape(shape), n_prompts=4)
    elif not os.path.exists(os.path.join(folder, "model.safetensors")):
        os.makedirs(folder, exist_ok=True)
        s = SHAPES[shape]
        write_gpt2_checkpoint(os.path.join(folder, "model.safetensors.part"), s["n_layer"],
                              s["n_embd"])
        os.replace(os.path.join(folder, "model.safetensors.part"),
                   os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({"n_head": s["n_head"]}, f)
        write_bpe_files(folder)
    b = BATCHES[batch]
    data = os.path.join(folder, batch)
    if os.path.exists(os.path.join(data, "prefs.jsonl")):
        return
    os.makedirs(data, exist_ok=True)
    tok = BPETokenizer.from_pretrained(folder)
    n = max(64, 2 * b["rollouts"], 8 * b["rm_batch"] + 2)  # room for 8 RM steps
    prompts = texts_of_length(tok, b["prompt"], n, seed=0)
    responses = texts_of_length(tok, b["new"] - 1, n, seed=1)  # + EOS
    others = texts_of_length(tok, b["new"] - 1, n, seed=2)

    def write(name, rows):
        with open(os.path.join(data, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    write("prompts.jsonl", [{"prompt": p} for p in prompts])
    write("demos.jsonl", [{"prompt": p, "response": " " + r} for p, r in zip(prompts, responses)])
    write("prefs.jsonl", [{"prompt": p, "chosen": " " + r, "rejected": " " + o}
                          for p, r, o in zip(prompts, responses, others)])


# ----------------------------------------------------------------------------- measuring
class Meter:
    """Peak memory of a stretch of code: reset() before it, peak_mb() after it."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def reset(self):
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM, the peak resident set size, to the current size

    def peak_mb(self) -> float:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM in /proc/self/status")


def write_rm_checkpoint(folder: str, rm_dir: str) -> None:
    """A reward model for PPO: the GPT-2 trunk + a random head, marked normalised, written by
    the code under test (so its tensor layout is that code's)."""
    import torch
    from mingpt_rlhf.stages import load_policy
    from mingpt_rlhf.machinery.checkpoint import save_checkpoint
    from mingpt_rlhf.heads import RewardModel
    from dataclasses import asdict
    policy, tokenizer, _ = load_policy("", folder)
    rm = RewardModel(policy.config)
    rm.gpt.load_state_dict(policy.state_dict())
    with torch.no_grad():
        rm.head.weight.normal_(std=0.02)
    save_checkpoint(os.path.join(rm_dir, "ckpt.pt"), {
        "stage": "rm", "model": rm.state_dict(), "model_config": asdict(rm.config),
        "tokenizer": tokenizer.state_dict(), "normalised": True, "step": 0})


def worker(spec: dict) -> dict:
    """One measurement, in this process, on the code in spec["code"]. PPO: the last of
    spec["iters"] iterations (default 1); SFT, RM: the mean of steps 2 ... spec["steps"] - 1
    (default 3 steps, so the second alone). Run in a fresh process (`run_worker`), or several
    in one (bench/gpu_once.py): the methods it wraps to measure are restored after each."""
    sys.path.insert(0, spec["code"])
    import torch
    import train_rm
    import train_sft
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    folder, b = spec["folder"], BATCHES[spec["batch"]]
    data = os.path.join(folder, spec["batch"])
    meter = Meter(spec["device"])
    result = {}
    out_dir = tempfile.mkdtemp(prefix="gpt2_scale_")
    common = dict(out_dir=out_dir, device=spec["device"], **spec["options"])

    from mingpt_rlhf.ppo_trainer import PPOTrainer
    patched = [(PPOTrainer, name, getattr(PPOTrainer, name)) for name in ("step", "make_experience", "learn")]
    patched += [(m, "lr_at", m.lr_at) for m in (train_sft, train_rm)]
    try:
        return _measure(spec, b, data, meter, result, out_dir, common, folder)
    finally:  # a caller that runs several workers in one process gets the classes back
        for owner, name, real in patched:
            setattr(owner, name, real)
        import shutil
        shutil.rmtree(out_dir, ignore_errors=True)


def _measure(spec, b, data, meter, result, out_dir, common, folder) -> dict:
    import torch

    import train_ppo
    import train_rm
    import train_sft
    if spec["stage"] == "ppo":
        from mingpt_rlhf.ppo_trainer import PPOTrainer
        # the reward model: written once per folder when the caller names where (spec["rm_dir"])
        rm_dir = spec.get("rm_dir") or os.path.join(out_dir, "rm")
        if not os.path.exists(os.path.join(rm_dir, "ckpt.pt")):
            write_rm_checkpoint(folder, rm_dir)
        real_step, in_step = PPOTrainer.step, []

        def measured_step(self, *args, **kwargs):
            in_step.append(True)
            start = time.perf_counter()
            out = real_step(self, *args, **kwargs)
            stats = out[1]
            result.update(seconds=time.perf_counter() - start,
                          peak_mb=max(result["peak_experience_mb"], result["peak_learn_mb"]),
                          **{k: stats[k] for k in ("t_generate", "t_score", "t_learn")},
                          finite=all(math.isfinite(v) for v in stats.values() if isinstance(v, float)))
            loop = getattr(self.generate, "keywords", {}).get("loop")  # --decode_graphs, on CUDA
            if loop is not None:
                result.update(decode_captures=len(loop.captures),
                              decode_capture_s=sum(c["seconds"] for c in loop.captures))
            in_step.clear()
            return out

        def phase(name, real):  # the peak of each phase of the measured step
            def measured(self, *args, **kwargs):
                if in_step:
                    meter.reset()
                out = real(self, *args, **kwargs)
                if in_step:
                    result[name] = max(result.get(name, 0.0), meter.peak_mb())
                return out
            return measured
        PPOTrainer.step = measured_step
        PPOTrainer.make_experience = phase("peak_experience_mb", PPOTrainer.make_experience)
        PPOTrainer.learn = phase("peak_learn_mb", PPOTrainer.learn)
        cfg = train_ppo.Config(init_from=folder, rm_dir=rm_dir,
                               prompts=os.path.join(data, "prompts.jsonl"),
                               max_iters=spec.get("iters", 1),
                               rollout_batch_size=b["rollouts"], minibatch_size=b["minibatch"],
                               ppo_epochs=b["epochs"], max_new_tokens=b["new"],
                               eval_prompts=2, eval_interval=10, target_kl=0.0,
                               decode_graphs=torch.cuda.is_available(), **common)
        if cfg.algo == "ppo":  # its pretraining term, read only by PPO
            cfg.ptx_data = os.path.join(data, "demos.jsonl")
        train_ppo.main(cfg)
    else:
        module = train_sft if spec["stage"] == "sft" else train_rm
        marks, steps = [], spec.get("steps", 3)

        def mark_each_step(*args, **kwargs):  # the loop calls lr_at once at each step's start
            if len(marks) == 1:
                meter.reset()
            peak = meter.peak_mb()  # on a GPU this waits for the queued work first
            marks.append((time.perf_counter(), peak))
            if spec.get("profile"):  # steps 2 ... steps - 2 under torch's profiler
                if len(marks) == 3:
                    profiler.__enter__()
                elif len(marks) == steps:
                    profiler.__exit__(None, None, None)
            return real_lr_at(*args, **kwargs)
        if spec.get("profile"):
            from torch.profiler import ProfilerActivity, profile
            profiler = profile(activities=[ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if spec["device"] == "cuda" else []))
        real_lr_at = module.lr_at
        module.lr_at = mark_each_step
        if spec["stage"] == "sft":
            cfg = train_sft.Config(init_from=folder, data=os.path.join(data, "demos.jsonl"),
                                   batch_size=b["sft_batch"], max_iters=steps, warmup_iters=1,
                                   eval_interval=10, **common)
        else:
            cfg = train_rm.Config(init_from=folder, data=os.path.join(data, "prefs.jsonl"),
                                  batch_size=b["rm_batch"], epochs=1, warmup_iters=1,
                                  eval_interval=10, norm_samples=0, **common)
            pairs = sum(1 for _ in open(cfg.data))
            # `steps` steps: as many pairs as that many batches, plus the 5 % held out
            cut = os.path.join(out_dir, "prefs.jsonl")
            with open(cfg.data) as src, open(cut, "w") as dst:
                dst.writelines(line for i, line in enumerate(src)
                               if i < min(pairs, int(steps * b["rm_batch"] / 0.95) + 2))
            cfg.data = cut
        module.main(cfg)
        # steps 2 ... steps - 1 run between the 2nd and the last mark
        if len(marks) < steps:
            raise RuntimeError(f"only {len(marks)} of {steps} steps ran")
        result.update(seconds=(marks[steps - 1][0] - marks[1][0]) / (steps - 2),
                      peak_mb=marks[steps - 1][1])
        if spec.get("profile"):
            result["profile"] = profile_summary(profiler, steps - 3, spec["profile"])
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def profile_summary(profiler, n_steps: int, path: str) -> dict:
    """torch's profiler table (by time on the device, else on the CPU) written to `path`, and
    per step: the device's busy time, the kernels launched, the host waits for the device."""
    events = profiler.key_averages()

    def device_us(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
    # a kernel's time shows under its own name and again under the operator that launched it:
    # the device's busy time is that of the kernels alone
    on_device = sum(device_us(e) for e in events if "CUDA" in str(getattr(e, "device_type", "")))
    sort = "self_device_time_total" if on_device else "self_cpu_time_total"
    try:
        table = events.table(sort_by=sort, row_limit=30)
    except (AttributeError, KeyError):
        sort = "self_cuda_time_total" if on_device else "self_cpu_time_total"
        table = events.table(sort_by=sort, row_limit=30)
    with open(path, "w") as f:
        f.write(table)
    counts = {e.key: e.count for e in events}
    top = sorted(events, key=lambda e: device_us(e) if on_device else e.self_cpu_time_total,
                 reverse=True)[:12]
    return {"steps": n_steps, "device_busy_ms_per_step": round(on_device / 1e3 / n_steps, 2),
            "kernel_launches_per_step": round(counts.get("cudaLaunchKernel", 0) / n_steps, 1),
            "graph_launches_per_step": round(counts.get("cudaGraphLaunch", 0) / n_steps, 1),
            "host_syncs_per_step": round(sum(counts.get(k, 0) for k in (
                "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync")) / n_steps, 1),
            "top": [[e.key[:60], round((device_us(e) if on_device else e.self_cpu_time_total)
                                       / 1e3 / n_steps, 3), e.count // n_steps] for e in top]}


# ----------------------------------------------------------------------------- the runs
def specs(args) -> list[dict]:
    """Every configuration to measure, for the code under test ("after")."""
    rows = []
    for critic in ["shared", "separate"]:
        for lora in [0, 16]:
            for ckpt in [False, True]:
                rows.append(dict(stage="ppo", options=dict(critic=critic, lora_rank=lora,
                                                           grad_checkpoint=ckpt)))
        # the leanest: also sample minibatch-sized slices (a smaller KV cache)
        rows.append(dict(stage="ppo", options=dict(
            critic=critic, lora_rank=16, grad_checkpoint=True,
            generate_batch_size=BATCHES[args.batch]["minibatch"])))
    for stage in ["sft", "rm"]:
        for lora in [0, 16]:
            for ckpt in [False, True]:
                rows.append(dict(stage=stage, options=dict(lora_rank=lora, grad_checkpoint=ckpt)))
    return rows


def old_options(options: dict) -> dict | None:
    """The options for code that predates LoRA, --grad_checkpoint and --generate_batch_size;
    None if it cannot run them."""
    if options.get("lora_rank") or options.get("grad_checkpoint") or options.get("generate_batch_size"):
        return None
    return {k: v for k, v in options.items() if k not in ("lora_rank", "grad_checkpoint")}


def extract_revision(rev: str) -> str:
    """The files of git revision `rev` in a temporary folder."""
    dest = tempfile.mkdtemp(prefix=f"mingpt_{rev}_")
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        tarfile.open(fileobj=f).extractall(dest)
    return dest


def run_worker(spec: dict) -> dict:
    env = dict(os.environ)
    if spec["mmap_threshold"]:
        # glibc then serves every allocation above this size with its own mmap and returns it
        # to the OS when freed; by default it raises the threshold as large blocks are freed,
        # keeps freed tensors in its heap, and the peak RSS counts that fragmentation too
        env["MALLOC_MMAP_THRESHOLD_"] = str(spec["mmap_threshold"])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd=spec["code"], env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="small", choices=list(SHAPES))
    ap.add_argument("--batch", default="cpu", choices=list(BATCHES))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--before", default="", help="git revision to measure as well (e.g. the "
                                                 "commit before a change)")
    ap.add_argument("--before_code", default="", help="the files of --before already extracted "
                    "(`git archive REV | tar -x -C DIR`), for a machine without the git history")
    ap.add_argument("--only", default="", help="comma-separated stages to run (ppo,sft,rm)")
    ap.add_argument("--critic", default="", help="only this PPO critic (shared or separate)")
    ap.add_argument("--where", default="", help="only the rows whose options match, e.g. "
                                                "lora_rank=16 or lora_rank=0,grad_checkpoint=True (named in the file name)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--mmap_threshold", type=int, default=0,
                    help="glibc MALLOC_MMAP_THRESHOLD_ for the workers (0 = glibc's dynamic "
                         "default); 131072 makes the peak RSS that of live tensors")
    ap.add_argument("--folder", default="out/gpt2_scale", help="where the fixtures are written")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    folder = os.path.abspath(os.path.join(args.folder, args.shape))
    prepare(folder, args.shape, args.batch)
    codes = [("after", ROOT)]
    if args.before:
        code = os.path.abspath(args.before_code) if args.before_code else extract_revision(args.before)
        codes.insert(0, (f"before ({args.before})", code))
    rows = []
    for spec in specs(args):
        if args.only and spec["stage"] not in args.only.split(","):
            continue
        if args.critic and spec["options"].get("critic", args.critic) != args.critic:
            continue
        if args.where and any(str(spec["options"].get(key)) != value for key, value in
                              (cond.split("=") for cond in args.where.split(","))):
            continue
        for label, code in codes:
            options = spec["options"] if code == ROOT else old_options(spec["options"])
            if options is None:
                continue
            full = dict(spec, options=options, code=code, folder=folder, batch=args.batch,
                        device=args.device, threads=args.threads,
                        mmap_threshold=args.mmap_threshold)
            row = {"code": label, "stage": spec["stage"], **spec["options"], **run_worker(full)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    import torch
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
    result = {"revision": revision, "shape": args.shape, "batch": BATCHES[args.batch], "device": args.device,
              "torch": torch.__version__, "threads": args.threads or torch.get_num_threads(),
              "mmap_threshold": args.mmap_threshold or "glibc default", "rows": rows}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    suffix = ("_mmap" if args.mmap_threshold else "") + (f"_{args.where.replace('=', '').replace(',', '_')}" if args.where else "")
    path = os.path.join(ROOT, "bench", "results",
                        f"gpt2_scale_{args.device}_{args.shape}_{args.batch}{suffix}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
