"""A random reward, exactly: what does the expected update do when the reward says nothing?

"Spurious rewards" (Shao et al. 2025) found that a reward drawn at random raised one model
family's accuracy, and blamed the clip of PPO's ratio: it would favour what the model already
does likely. The enumerable world (lab/tabular.py) lets us compute the expected update under
such a reward exactly: each response's reward is a fair coin of its own, and the oracle
(lab/gradients.py, `expected_update(coin=True)`) lists every batch the sampler can draw and
every outcome of its coins. No KL penalty (beta 0), so the reward is all there is.

- **ratio 1** (the first minibatch: the policy that learns sampled the batch): the advantage
  of a response is independent of the response, so the expected update is 0, clip or not.
- **a later minibatch** (the sampler one update behind the learner, per-token ratios of about
  0.8-1.5): without the clip, the ratio reweighs the batch to the learner's own distribution
  and the update is 0 again; with it, the clip keeps some terms and drops others by the sign
  of their advantage and the size of their ratio, and the update is not 0. `clip_bias`
  measures which way it moves each response: the change of log pi(y) along the update, set
  against how likely y was.

    python -m mingpt_rlhf.lab.spurious          # prints the table and writes --json if given
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from .gradients import Row, _spec, evaluation_point, expected_update
from .tabular import make_world, response_logprobs

NO_CLIP = 1e6   # a clip range no ratio reaches


def rows(clip: float = 0.2) -> list[Row]:
    """GRPO (Dr. GRPO's mean baseline, budget reduction) and RLOO, no KL, at ratio 1 and on a
    later minibatch, with and without the clip."""
    out = []
    for advantages in ("dr_grpo", "rloo"):
        for sampler in ("current", "behind"):
            for c in (clip, NO_CLIP):
                name = f"{advantages}, {'ratio 1' if sampler == 'current' else 'a later minibatch'}, "
                name += "no clip" if c == NO_CLIP else f"clip {c}"
                out.append(Row(name, _spec(advantages=advantages, reduction="budget",
                                           clip_range=c, clip_high=c), sampler=sampler))
    return out


def clip_bias(row: Row, seed: int = 0) -> dict:
    """The expected update of `row` under coin rewards in world `seed` (beta 0), and what it
    does to each response: d log pi(y) along the update, its correlation with the sampler's
    log pi(y), and the change of the likeliest response's log-probability."""
    world = dataclasses.replace(make_world(seed), beta=0.0)
    table, behind = evaluation_point(world)
    update = expected_update(row, table, world, behind if row.sampler != "current" else None,
                             coin=True)
    theta = table.detach().clone().requires_grad_(True)
    jac = torch.autograd.functional.jacobian(response_logprobs, theta)      # (Y, P, V)
    moves = (jac * update).sum((-2, -1))                                    # d log pi(y)
    sampler = response_logprobs(behind if row.sampler != "current" else table)
    learner = response_logprobs(table)
    likeliest = int(sampler.argmax())

    def corr(a, b):  # the correlation over responses, weighing each response alike
        a, b = a - a.mean(), b - b.mean()
        return float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-300))
    moved = float(update.norm()) > 1e-12
    # the entropy of the learner's response distribution, and its change along the update
    entropy = lambda t: -(response_logprobs(t).exp() * response_logprobs(t)).sum()  # noqa: E731
    d_entropy = (torch.autograd.functional.jacobian(entropy, theta) * update).sum()
    return {"row": row.name, "update_norm": float(update.norm()),
            "dlogp_likeliest": float(moves[likeliest]),
            "corr_with_logp": corr(moves, sampler) if moved else 0.0,
            "corr_with_way_back": corr(moves, sampler - learner) if moved else 0.0,
            "d_entropy": float(d_entropy)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="worlds")
    ap.add_argument("--clip", type=float, default=0.2, help="the clip range")
    ap.add_argument("--json", default="", help="write the table here")
    args = ap.parse_args(argv)
    if not 0 < args.clip < 1:
        print(f"error: --clip must be in (0, 1), got {args.clip}", file=sys.stderr)
        sys.exit(2)
    table = [dict(clip_bias(row, seed), world=seed) for seed in args.seeds for row in rows(args.clip)]
    for r in table:
        print(f"world {r['world']}  {r['row']:<40} |update| {r['update_norm']:.2e}  "
              f"d log pi(likeliest) {r['dlogp_likeliest']:+.2e}  corr with log pi "
              f"{r['corr_with_logp']:+.2f}, with the way back {r['corr_with_way_back']:+.2f}  "
              f"dH {r['d_entropy']:+.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python -m mingpt_rlhf.lab.spurious", "rows": table}, f, indent=1)
    return {"rows": table}


if __name__ == "__main__":
    main(sys.argv[1:])
