"""Rewards from code on your own data: GRPO on the arithmetic example, where each prompt of the
file carries its reference answer and the reward function reads it.

    python bench/user_data.py                  # SFT once, then GRPO with seeds 0, 1, 2
    python bench/user_data.py --seeds 0        # one seed

The data (examples/arithmetic/, written by make_data.py there): two-digit additions; the
demonstrations come from a teacher whose last digit is off by one on 30 % of problems; the
held-out problems (eval.jsonl) are pairs of numbers that training never shows in either order.
SFT learns from the demonstrations (seed 1337, the script's defaults but for a block of 32
tokens); then `train_ppo.py --algo grpo --reward examples/arithmetic/reward.py:exact` with
each seed, `--prompts` and `--eval_prompts_file` holding the answers. The figure is exact-match
accuracy on the 200 first held-out problems, one sample each at temperature 1: the SFT
policy's (the run's step-0 eval) and the GRPO policy's (its final eval), with the KL to the SFT
policy and the run's seconds.

Every finished run is kept in bench/results/user_data.json as soon as it ends and not run
again (--rerun redoes them), so a killed bench continues where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train_ppo  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

DATA = os.path.join(ROOT, "examples", "arithmetic")
RESULTS = os.path.join(ROOT, "bench", "results", "user_data.json")
SFT = dict(data=os.path.join(DATA, "demos.jsonl"), eval_data=os.path.join(DATA, "demos_eval.jsonl"),
           block_size=32, max_new_tokens=8)
GRPO = dict(prompts=os.path.join(DATA, "prompts.jsonl"),
            eval_prompts_file=os.path.join(DATA, "eval.jsonl"), algo="grpo",
            reward=os.path.join(DATA, "reward.py") + ":exact", actor_lr=1e-4, max_new_tokens=8,
            max_iters=300, eval_interval=50)


def save(result: dict) -> None:
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, RESULTS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work_dir", default=os.path.join(ROOT, "out", "bench_user_data"))
    parser.add_argument("--rerun", action="store_true", help="run again what the JSON holds")
    args = parser.parse_args()
    result = json.load(open(RESULTS)) if os.path.exists(RESULTS) and not args.rerun else {}
    result.update(sft_options=SFT, grpo_options=GRPO)
    result.setdefault("runs", {})
    sft_dir = os.path.join(args.work_dir, "sft")
    if not os.path.exists(os.path.join(sft_dir, "ckpt.pt")):
        t0 = time.time()
        train_sft.main(train_sft.Config(out_dir=sft_dir, **SFT))
        result["sft_seconds"] = round(time.time() - t0, 1)
        save(result)
    for seed in args.seeds:
        if str(seed) in result["runs"]:
            continue
        out = os.path.join(args.work_dir, f"grpo_{seed}")
        t0 = time.time()
        train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft_dir, seed=seed, **GRPO))
        evals = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if r.get("split") == "eval"]
        result["runs"][str(seed)] = {
            "sft_accuracy": evals[0]["reward"], "grpo_accuracy": evals[-1]["reward"],
            "kl": evals[-1]["kl"], "seconds": round(time.time() - t0, 1),
            "curve": [(r["step"], round(r["reward"], 4), round(r["kl"], 3)) for r in evals]}
        save(result)
        print(json.dumps({"seed": seed, **{k: v for k, v in result["runs"][str(seed)].items()
                                           if k != "curve"}}))


if __name__ == "__main__":
    main()
