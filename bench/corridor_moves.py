"""Does a corridor run's policy read where the door is? Its moves by door, from its rollouts.

    python bench/corridor_moves.py out/bench_corridor/grpo_5e-05_seed1 ...   # run folders

examples/corridor_env.py puts the door at cell 0 or cell 8; perfect play walks left to a door
at 0 and right to a door at 8. For each run folder (bench/user_games.py writes them, each
with its rollouts.jsonl) this reads the episodes recorded at the run's last recorded
iteration and counts, per door, the share of the policy's moves that were "left". A policy
that reads the door has about 1.0 for door 0 and 0.0 for door 8; one that plays alike
whatever the door has the two shares close. Also the run's mean `entropy` and `zero_groups`
over its last 50 iterations (metrics.jsonl). Written to bench/results/corridor_moves.json,
keyed by the folder's name.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "corridor_moves.json")
DOOR = re.compile(r"the door is at (\d+)")


def moves_by_door(rollouts: list[dict]) -> dict:
    """{door: share of "left" among the policy's moves} over the last recorded iteration."""
    last = max(r["step"] for r in rollouts)
    counts = {}
    for r in rollouts:
        if r["step"] != last:
            continue
        door = int(DOOR.search(r["prompt"]).group(1))
        words = [t.strip() for t, env in zip(r["tokens"], r["env"]) if env == 0]
        moves = [w for w in words if w in ("left", "right")]
        left, total = counts.get(door, (0, 0))
        counts[door] = (left + moves.count("left"), total + len(moves))
    return {"step": last, **{f"left_share_door_{d}": round(left / max(1, total), 3)
                             for d, (left, total) in sorted(counts.items())}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders with rollouts.jsonl and metrics.jsonl")
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args()
    result = results_file.load(args.results)
    for folder in args.runs:
        with open(os.path.join(folder, "rollouts.jsonl"), encoding="utf-8") as f:
            rollouts = [json.loads(line) for line in f]
        with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
            train = [r for r in map(json.loads, f) if "pg_loss" in r][-50:]
        row = moves_by_door(rollouts)
        row.update({k: round(sum(r[k] for r in train) / len(train), 3)
                    for k in ("entropy", "zero_groups")})
        result["runs"][os.path.basename(os.path.normpath(folder))] = row
        print(os.path.basename(os.path.normpath(folder)), row)
    results_file.save(args.results, result)


if __name__ == "__main__":
    main()
