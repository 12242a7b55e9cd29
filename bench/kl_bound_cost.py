"""What the adaptive KL controller's lower bound costs a long run whose KL stays below target.

    python bench/kl_bound_cost.py --game duel --seeds 0 3

The controller keeps beta within [kl_coef / 10, 10 kl_coef] (AdaptiveKLController in
mingpt_rlhf/ppo.py). In the example games' 300-iteration GRPO runs (bench/user_games.py at
`--actor_lr 1e-4`, the `--env` defaults) the KL stays below its target for most of the run and
beta rests at the lower bound for the last 100-180 iterations. This runs the same command as
user_games.py's row `grpo/0.0001/SEED` with the lower bound taken away (the upper one kept:
`AdaptiveKLController.__init__` patched here, as bench/details.py patches a detail out) and
writes, per seed, the held-out evals, the final win rate, beta's last and least values, and
the same figures of that row of bench/results/user_games_GAME.json (the bounded run; both start
from the same SFT policy, bench/user_games.py's, trained if missing). Each run is saved to
bench/results/kl_bound_cost.json as it ends.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

from mingpt_rlhf import ppo  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from user_games import GAMES, run_rl, sft_of  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "kl_bound_cost.json")
RATE = 1e-4


def betas(out: str) -> dict:
    kl_coef = [r["kl_coef"] for r in read_metrics(os.path.join(out, "metrics.jsonl")) if "kl_coef" in r]
    return {"beta_last": kl_coef[-1], "beta_least": min(kl_coef)}


def without_lower_bound():
    """AdaptiveKLController with its lower bound taken away (beta may fall as far as it goes)."""
    init = ppo.AdaptiveKLController.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.low = 0.0
    ppo.AdaptiveKLController.__init__ = patched


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--game", choices=list(GAMES), required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 3])
    ap.add_argument("--work", default="", help="folder of the runs (default: out/bench_GAME, "
                                                "user_games.py's, whose SFT policy it shares)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or os.path.join(ROOT, "out", f"bench_{args.game}")
    bounded = results_file.load(os.path.join(ROOT, "bench", "results", f"user_games_{args.game}.json"))
    result = results_file.load(RESULTS)
    sft = sft_of(args.game, work)
    without_lower_bound()
    for seed in args.seeds:
        key = f"{args.game}/grpo/{RATE:g}/{seed}"
        if key in result["runs"]:
            continue
        out = os.path.join(work, f"grpo_no_lower_bound_{RATE:g}_seed{seed}")
        run = run_rl(args.game, "grpo", RATE, seed, sft, out, 300)
        with_bound = dict(bounded["runs"].get(f"grpo/{RATE:g}/{seed}") or {})
        its_run = os.path.join(work, f"grpo_{RATE:g}_seed{seed}")  # user_games.py's folder of it
        if with_bound and os.path.exists(os.path.join(its_run, "metrics.jsonl")):
            with_bound.update(betas(its_run))
        result["runs"][key] = {**run, **betas(out), "bounded": with_bound}
        results_file.save(RESULTS, result)
        b = result["runs"][key]["bounded"] or {}
        print(f"{key}: without the lower bound {run['win']:.3f} (beta {result['runs'][key]['beta_last']:.4f} "
              f"at the end), with it {b.get('win', float('nan')):.3f}")


if __name__ == "__main__":
    main()
