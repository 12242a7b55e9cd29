"""A random reward in training: does GRPO's sort accuracy move when the reward is a coin?

    python bench/spurious.py                      # seeds 0 1 2, with and without the clip
    python bench/spurious.py --seeds 0 --iters 20 # a quick look

For each seed: the sort task's SFT policy (`train_sft.py --task sort --seed S`, shared with
bench/passk.py's folder when it is there), then GRPO from it with the reward a fair coin per
response (bench/coin_reward.py, COIN_SEED = S), every other option at its default, once with
PPO's clip (--clip_range 0.2) and once without it (--clip_range 100: no ratio reaches it). The
held-out accuracy (`gold`, the exact-match check, which the run never trains on), the token
entropy and the KL to the SFT policy are read at every eval. Shao et al. (2025) saw a random
reward raise one model family's accuracy and blamed the clip; lab/spurious.py computes the
expected update of such a reward exactly.

Each run is saved to bench/results/spurious.json as it ends; a run already there is skipped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "spurious.json")
CLIPS = {"clip": 0.2, "no_clip": 100.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iters", type=int, default=0, help="RL iterations (0: train_ppo's default)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_passk"))
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = results_file.load(args.results)
    for seed in args.seeds:
        sft = os.path.join(args.work, f"seed{seed}", "sft")
        results_file.train_stage(train_sft.main, train_sft.Config, sft, task="sort", seed=seed)
        for name, clip in CLIPS.items():
            key = f"{name}/{seed}"
            if key in result["runs"]:
                continue
            out = os.path.join(args.work, f"seed{seed}", f"coin_{name}")
            os.environ["COIN_SEED"] = str(seed)  # train_ppo.py loads the file anew: seeded so
            options = dict(max_iters=args.iters) if args.iters else {}
            start = time.time()
            train_ppo.main(train_ppo.Config(
                out_dir=out, sft_dir=sft, task="sort", seed=seed, algo="grpo", clip_range=clip,
                reward=os.path.join(ROOT, "bench", "coin_reward.py") + ":coin", **options))
            rows = read_metrics(os.path.join(out, "metrics.jsonl"))
            evals = [r for r in rows if r.get("split") == "eval" or r.get("final")]
            train = [r for r in rows if "entropy" in r and "split" not in r]
            result["runs"][key] = {
                "seconds": round(time.time() - start, 1), "clip_range": clip,
                "gold": [[r["step"], r["gold"]] for r in evals if "gold" in r],
                "kl": [[r["step"], r["kl"]] for r in evals if "kl" in r],
                "entropy": [[r["step"], r["entropy"]] for r in train][::10]}
            results_file.save(args.results, result)
            g = result["runs"][key]["gold"]
            print(f"{key}: gold {g[0][1]:.3f} -> {g[-1][1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
