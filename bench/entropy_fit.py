"""Fit Cui et al.'s law R = -a exp(H) + b to runs: how much reward each nat of entropy bought.

    python bench/entropy_fit.py RUN_DIR [RUN_DIR ...] [--score win] [--json F]

For each run folder (a train_ppo.py out_dir), the pairs (H, R) along training: R the held-out
figure at each eval (`--score`: gold by default, `win` for a game), H the policy's mean token
entropy on the rollouts of the iteration before it (the `entropy` train_ppo.py logs: sampled
prompts, not held-out ones). A least-squares line of R on exp(H) gives a and b (R = -a exp(H)
+ b is linear in exp(H)), its r2, and what it predicts when the entropy is spent, R(H = 0) =
b - a. One fit per run, and one over all the runs given.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402


def pairs(run_dir: str, score: str) -> list[tuple[float, float]]:
    """(H, R) at every eval after the first whose iteration logged an entropy."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    entropy = {r["step"]: r["entropy"] for r in rows if "entropy" in r and "split" not in r}
    out = []
    for r in rows:
        if r.get("split") == "eval" and score in r and r["step"] in entropy:
            out.append((entropy[r["step"]], r[score]))
    return out


def fit(points: list[tuple[float, float]]) -> dict:
    """R = -a exp(H) + b by least squares: a, b, r2 and R at H = 0."""
    xs = [math.exp(h) for h, _ in points]
    ys = [r for _, r in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx else 0.0
    b = my - slope * mx
    ss_res = sum((y - (slope * x + b)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return {"a": -slope, "b": b, "r2": 1 - ss_res / ss_tot if ss_tot else 0.0,
            "predicted_at_zero_entropy": b + slope, "points": n,
            "entropy_range": [min(h for h, _ in points), max(h for h, _ in points)]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="train_ppo.py out_dir folders")
    ap.add_argument("--score", default="gold", help="the held-out figure of each eval line")
    ap.add_argument("--json", default="", help="write the fits here")
    ap.add_argument("--source", default="", help="what made the runs, for the JSON (as "
                    "\"python bench/passk.py, seeds 0-2\")")
    args = ap.parse_args(argv)
    every, result = [], {"score": args.score, "runs": {}}
    result["command"] = " ".join(["python bench/entropy_fit.py", *(argv if argv is not None else sys.argv[1:])])
    result["measured"] = results_file.measured(ROOT) + (f"; the runs: {args.source}" if args.source else "")
    for run in args.runs:
        if not os.path.exists(os.path.join(run, "metrics.jsonl")):
            print(f"error: no metrics.jsonl in {run}", file=sys.stderr)
            sys.exit(2)
        points = pairs(run, args.score)
        if len(points) < 3:
            print(f"error: {run} has {len(points)} evals with an entropy beside them; a fit "
                  f"needs 3 (is --score {args.score} logged there?)", file=sys.stderr)
            sys.exit(2)
        result["runs"][os.path.join(*os.path.normpath(run).split(os.sep)[-2:])] = fit(points)
        every += points
    result["all"] = fit(every)
    for name, f in [*result["runs"].items(), ("all", result["all"])]:
        print(f"{name}: a {f['a']:.3f}, b {f['b']:.3f}, r2 {f['r2']:.2f}, R(H=0) "
              f"{f['predicted_at_zero_entropy']:.3f}, {f['points']} points, H "
              f"{f['entropy_range'][0]:.3f}-{f['entropy_range'][1]:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
