"""What an ensemble of reward models costs PPO, against one reward model: seconds of scoring per
iteration, seconds per iteration, and the process's peak memory.

    python bench/ensemble_cost.py                  # 3 rounds, 20 iterations each, ~5 min
    python bench/ensemble_cost.py --rounds 1 --iters 3 --results /tmp/cost.json   # the code runs

Each reward is used by train_ppo.py (its defaults: PPO with a shared critic) in a fresh
process, one after the other in each round so that a busy machine slows them alike: "single"
(bench/reward_hacking.py's member 0, a whole reward model), "mean" (its 4 members, scored
together; wco and uwo score the same 4 models and differ only in one line of arithmetic), and
"warm" (the members' weights averaged: one model). The reward models are those of
bench/reward_hacking.py for --seed (0 % label noise), trained by it first. Figures per
iteration come from metrics.jsonl (t_score: the scoring pass; time: the wall clock, evals
included), peak memory is the process's VmHWM, loading and the final eval included. Timing
needs the machine to itself: run nothing beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

RESULTS = os.path.join(ROOT, "bench", "results", "ensemble_cost.json")
REWARDS = {"single": ("member0", "mean"), "mean": ("", "mean"), "warm": ("", "warm")}


def child(rule: str, root: str, iters: int, out: str, threads: int) -> dict:
    """One train_ppo run in this process; its figures and this process's peak memory."""
    import torch
    torch.set_num_threads(threads)
    import train_ppo
    from mingpt_rlhf.run.metrics import read_metrics
    from vs_peers import peak_rss_mb
    member, combine = REWARDS[rule]
    rm_dir = os.path.join(root, "hack", "rm_noise0", member)
    train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=os.path.join(root, "sft"), rm_dir=rm_dir.rstrip("/"),
                                    ensemble_combine=combine, max_iters=iters, eval_interval=10 ** 6,
                                    seed=0))
    rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl"))
            if "split" not in r and not r.get("final") and "t_score" in r]
    peak = peak_rss_mb()
    return {"t_score": statistics.median(r["t_score"] for r in rows[1:] or rows),
            "t_iteration": statistics.median(b["time"] - a["time"] for a, b in zip(rows, rows[1:])),
            "peak_rss_mb": round(peak, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20, help="PPO iterations per run")
    ap.add_argument("--seed", type=int, default=0, help="whose reward models (bench/reward_hacking.py)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    root = os.path.join(args.work, f"seed{args.seed}")
    if args.child:
        print("RESULT " + json.dumps(child(args.child, root, args.iters, args.out, args.threads)))
        return
    if not os.path.exists(os.path.join(root, "hack", "rm_noise0", "ensemble.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "reward_hacking.py"), "--seeds",
                        str(args.seed), "--parts", "bon", "--noise", "0"], check=True)
    runs = {rule: [] for rule in REWARDS}
    for _ in range(args.rounds):
        for rule in REWARDS:
            with tempfile.TemporaryDirectory() as out:
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", rule,
                                       "--out", out, "--iters", str(args.iters), "--seed", str(args.seed),
                                       "--work", args.work, "--threads", str(args.threads)],
                                      capture_output=True, text=True, check=True)
            line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
            runs[rule].append(json.loads(line[len("RESULT "):]))
            print(rule, runs[rule][-1], flush=True)
    summary = {}
    for rule, rows in runs.items():
        summary[rule] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for k in ("t_score", "t_iteration", "peak_rss_mb"):
            summary[rule][f"{k}_vs_single"] = [round(r[k] / s[k], 2) for r, s in zip(rows, runs["single"])]
    import platform
    result = {"iters": args.iters, "rounds": args.rounds, "threads": args.threads,
              "machine": platform.processor() or platform.machine(), "runs": runs, "summary": summary}
    with open(args.results, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
