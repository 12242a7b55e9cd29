"""What `max_logratio` costs: its seconds against the rest of an iteration's, in one run each.

    python bench/logratio_cost.py --sft_dir out/sft --rm_dir out/rm --duel_sft_dir out/bench_duel/sft

`max_logratio` (run/watch.py) runs one more forward pass of the actor and of the
reference over the first minibatch's rows every iteration. This times it inside two short
runs on one thread: the built-in pipeline's PPO at its defaults (the SFT and reward model of
`python train_sft.py` / `train_rm.py`), and GRPO on the duel game of examples/duel_env.py
(its SFT policy as bench/user_games.py trains it). Per run: the seconds spent in
`largest_logratio`, those of the iterations' logged phases (t_generate + t_score + t_learn),
the share of the first in their sum, and the last iterations' figures. Written to
bench/results/logratio_cost.json. A timing: give it the machine to itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402


def timed_run(options: dict, iters: int) -> dict:
    spent, measure = [], train_ppo.largest_logratio

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = measure(*args, **kwargs)
        spent.append(time.perf_counter() - start)
        return out

    train_ppo.largest_logratio = timed
    try:
        with tempfile.TemporaryDirectory() as out:
            train_ppo.main(train_ppo.Config(out_dir=out, max_iters=iters, eval_interval=10 ** 6,
                                            **options))
            with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
                rows = [r for r in map(json.loads, f) if "pg_loss" in r]
    finally:
        train_ppo.largest_logratio = measure
    phases = sum(r["t_generate"] + r["t_score"] + r["t_learn"] for r in rows)
    return {"iterations": len(rows), "logratio_s": round(sum(spent), 3),
            "phases_s": round(phases, 3), "share": round(sum(spent) / (phases + sum(spent)), 4),
            "max_logratio_last": [r["max_logratio"] for r in rows[-3:]],
            "kl_last": [r["kl"] for r in rows[-3:]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft_dir", required=True)
    ap.add_argument("--rm_dir", required=True)
    ap.add_argument("--duel_sft_dir", required=True)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results", "logratio_cost.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = {"reviews_ppo": dict(sft_dir=args.sft_dir, rm_dir=args.rm_dir),
            "duel_grpo": dict(sft_dir=args.duel_sft_dir, algo="grpo", max_new_tokens=3,
                              env=os.path.join(ROOT, "examples", "duel_env.py") + ":Duel")}
    result = {"runs": {}, "date": time.strftime("%Y-%m-%d"), "threads": 1}
    for name, options in runs.items():
        result["runs"][name] = timed_run(options, args.iters)
        print(name, result["runs"][name], flush=True)
    results_file.save(args.results, result)


if __name__ == "__main__":
    main()
