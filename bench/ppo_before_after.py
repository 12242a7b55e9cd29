"""The built-in pipeline's PPO (`python train_ppo.py`, every default) on the code of two git
revisions, from the same SFT and reward-model checkpoints, seed by seed, alternating: seconds
of the whole run, and the final held-out gold, well_formed and KL, so a speed-up is a ratio
measured in one run and its price in quality (if any) is beside it.

    python train_sft.py && python train_rm.py                 # out/sft, out/rm (once)
    python bench/ppo_before_after.py --before 5d5813f         # seeds 1337 1338 1339
    python bench/ppo_before_after.py --before 5d5813f --seeds 1337 --max_iters 40

Each run is a fresh process (`train_ppo.main` of that revision's files, extracted with git
archive). Writes bench/results/ppo_before_after.json.
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
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gpt2_scale import extract_revision  # noqa: E402

WORKER = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import train_ppo
cfg = train_ppo.Config(**json.loads(sys.argv[1]))
start = time.time()
summary = train_ppo.main(cfg)
print(json.dumps({"seconds": time.time() - start, **{k: summary[k] for k in
                  ("gold", "well_formed", "kl", "rm_score", "distinct2") if k in summary}}))
"""


def run(code: str, options: dict) -> dict:
    env = {**os.environ, "MINGPT_RLHF_PLOT": "0", "PYTHONPATH": code}
    proc = subprocess.run([sys.executable, "-c", WORKER, json.dumps(options)], cwd=code, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed in {code}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision to compare with the working tree")
    ap.add_argument("--seeds", type=int, nargs="*", default=[1337, 1338, 1339])
    ap.add_argument("--max_iters", type=int, default=200)
    ap.add_argument("--sft_dir", default=os.path.join(ROOT, "out", "sft"))
    ap.add_argument("--rm_dir", default=os.path.join(ROOT, "out", "rm"))
    args = ap.parse_args()
    codes = {"before": extract_revision(args.before), "after": ROOT}
    rows = []
    for seed in args.seeds:
        for label, code in codes.items():
            out_dir = tempfile.mkdtemp(prefix=f"ppo_{label}_")
            result = run(code, dict(sft_dir=args.sft_dir, rm_dir=args.rm_dir, out_dir=out_dir,
                                    seed=seed, max_iters=args.max_iters))
            rows.append({"code": label, "seed": seed, **{k: round(v, 4) for k, v in result.items()}})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for label in codes:
        mine = [r for r in rows if r["code"] == label]
        summary[label] = {k: {"mean": round(statistics.mean(r[k] for r in mine), 4),
                              "min": min(r[k] for r in mine), "max": max(r[k] for r in mine)}
                          for k in ("seconds", "gold", "well_formed", "kl")}
    ratios = [b["seconds"] / a["seconds"] for b, a in zip(rows[0::2], rows[1::2])]
    summary["speedup"] = {"per_seed": [round(r, 3) for r in ratios],
                          "median": round(statistics.median(ratios), 3)}
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
    result = {"before": args.before, "after": f"{revision} (+ working tree)",
              "max_iters": args.max_iters, "rows": rows, "summary": summary}
    path = os.path.join(ROOT, "bench", "results", "ppo_before_after.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
