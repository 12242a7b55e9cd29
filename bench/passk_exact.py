"""pass@k in the enumerable world, exactly: does the policy RL converges to solve fewer problems
at large k than the reference it started from?

    python bench/passk_exact.py                 # 10 worlds, the rows below, up to 400 steps each
    python bench/passk_exact.py --worlds 3 --steps 100

Each world of lab/tabular.py (15 responses, a reference with random logits, a reward uniform
in [-1, 1]; seeds 0 .. --worlds - 1) is one problem; its right answers are the --right
responses of highest reward. A policy's chance of sampling a right answer in a world is p, a
sum over the responses it lists, so pass@k = 1 - (1 - p)^k exactly (k draws with
replacement: what the unbiased estimator of lab/passk.py estimates), and a curve is its mean
over the worlds. Policies: the reference, pi* (the maximiser of E[r] - beta KL, beta 0.5),
and where the exact ascent of some of the oracle's rows (lab/gradients.py) ends from the
reference (at most --steps natural-gradient steps).

In one world two policies' curves cannot cross (pass@k grows with p at every k), so a
crossing needs problems that RL moves in opposite directions. pi* = ref x exp(r / beta) / Z
raises the mass of every set {r >= t}, the right answers included, in every world: its curve
is above the reference's at every k. A row that ends elsewhere may not be.

Writes bench/results/passk_exact.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mingpt_rlhf.lab.gradients import ROWS, exact_ascent  # noqa: E402
from mingpt_rlhf.lab.tabular import make_world, optimal_policy, response_logprobs  # noqa: E402

KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
ASCENT_ROWS = ["dr grpo (budget, k1 in the reward)", "k1 in the loss (rloo)",
               "k3 in the loss (rloo)", "entropy bonus 0.1 (rloo)",
               "grpo as published (std, sequence mean, k3 in the loss)"]


def right_mass(table: torch.Tensor, reward: torch.Tensor, right: int) -> float:
    """The policy's probability of one of the `right` responses of highest reward."""
    best = reward.topk(right).indices
    return float(response_logprobs(table).exp()[best].sum())


def curve(ps: list[float]) -> dict:
    return {str(k): sum(1 - (1 - p) ** k for p in ps) / len(ps) for k in KS}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=10)
    ap.add_argument("--right", type=int, default=2, help="right answers per world (of 15)")
    ap.add_argument("--steps", type=int, default=400, help="most steps of each ascent")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "passk_exact.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = {row.name: row for row in ROWS}
    p = {"reference": [], "pi_star": [], **{name: [] for name in ASCENT_ROWS}}
    outcomes = {name: [] for name in ASCENT_ROWS}
    start = time.time()
    for seed in range(args.worlds):
        world = make_world(seed)
        p["reference"].append(right_mass(world.ref, world.reward, args.right))
        p["pi_star"].append(right_mass(optimal_policy(world), world.reward, args.right))
        for name in ASCENT_ROWS:
            ascent = exact_ascent(rows[name], world, steps=args.steps)
            p[name].append(right_mass(ascent.table, world.reward, args.right))
            outcomes[name].append(ascent.outcome)
        print(f"world {seed}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in p.items()), flush=True)
    result = {"command": "python bench/passk_exact.py " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "worlds": args.worlds, "right": args.right,
              "steps": args.steps, "seconds": round(time.time() - start, 1),
              "p_right": p, "outcomes": outcomes,
              "pass_at_k": {name: curve(ps) for name, ps in p.items()},
              "below_reference": {name: sum(a < b - 1e-12 for a, b in zip(ps, p["reference"]))
                                  for name, ps in p.items()}}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for name, c in result["pass_at_k"].items():
        print(f"{name:<58} " + " ".join(f"{c[str(k)]:.3f}" for k in (1, 4, 16, 64, 256)))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
