"""The entropy mechanism's covariance law against the exact entropy change, in the enumerable world.

    python bench/entropy_exact.py                  # 10 worlds, four step sizes

Cui et al. (2025) write one policy-gradient step's change of the policy's entropy as minus
the covariance, over the tokens the policy writes, of a token's log-probability and (for the
plain policy gradient) its probability times its advantage. In each world of lab/tabular.py
(beta 0: the reward alone) this takes one exact step along the exact gradient of E[r] from the
oracle's evaluation point, lr x (d(s) pi(a|s) A(s, a)), and reports per step size:
- `exact`: the change of the token entropy a run logs (each prefix's entropy weighed by the
  chance of reaching it, after the step);
- `fixed_visits`: the same with the weights held at their value before the step;
- `predicted`: -lr x the visit-weighted covariance of log pi and the update (lab/entropy.py).
The ratio fixed_visits / predicted goes to 1 as the step shrinks (the law holds to first
order per prefix); exact / predicted does not: moving where the policy goes changes the
logged entropy too, which the law leaves out.

Writes bench/results/entropy_exact.json.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mingpt_rlhf.lab.entropy import covariance_prediction, token_entropy  # noqa: E402
from mingpt_rlhf.lab.gradients import evaluation_point  # noqa: E402
from mingpt_rlhf.lab.tabular import make_world, objective_gradient, visits  # noqa: E402

STEPS = [1e-3, 0.1, 1.0, 3.0]


def world_rows(seed: int) -> list[dict]:
    world = dataclasses.replace(make_world(seed), beta=0.0)
    table, _ = evaluation_point(world)
    grad = objective_gradient(table, world)          # = d(s) pi(a|s) A(s, a): tested
    before, weights = token_entropy(table), visits(table)
    rows = []
    for lr in STEPS:
        after = table + lr * grad
        exact = float(token_entropy(after) - before)
        fixed = float(token_entropy(after, weights) - before)
        predicted = float(covariance_prediction(table, grad, lr))
        rows.append({"world": seed, "lr": lr, "max_logit_move": float((lr * grad).abs().max()),
                     "exact": exact, "fixed_visits": fixed, "predicted": predicted,
                     "fixed_over_predicted": fixed / predicted,
                     "exact_over_predicted": exact / predicted,
                     "sign_agrees": (exact > 0) == (predicted > 0)})
    return rows


def main():
    torch.set_num_threads(1)
    start = time.time()
    rows = [r for seed in range(10) for r in world_rows(seed)]
    summary = {}
    for lr in STEPS:
        at = [r for r in rows if r["lr"] == lr]
        summary[str(lr)] = {k: {"min": min(r[k] for r in at), "max": max(r[k] for r in at)}
                            for k in ("fixed_over_predicted", "exact_over_predicted", "max_logit_move")}
        summary[str(lr)]["sign_agrees"] = sum(r["sign_agrees"] for r in at)
    result = {"command": "python bench/entropy_exact.py", "date": time.strftime("%Y-%m-%d"),
              "worlds": 10, "seconds": round(time.time() - start, 1), "summary": summary,
              "rows": rows}
    path = os.path.join(ROOT, "bench", "results", "entropy_exact.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for lr, s in summary.items():
        print(f"lr {lr:>6}: max logit move {s['max_logit_move']['min']:.3g}-{s['max_logit_move']['max']:.3g}, "
              f"fixed visits / predicted {s['fixed_over_predicted']['min']:.3f}-{s['fixed_over_predicted']['max']:.3f}, "
              f"exact / predicted {s['exact_over_predicted']['min']:.3f}-{s['exact_over_predicted']['max']:.3f}, "
              f"sign agrees in {s['sign_agrees']} of 10")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
