"""Does --kl_target hold? PPO on the built-in task at several KL targets, defaults otherwise.

    python bench/kl_control.py                    # ~15 min on 2 CPU cores, after bench/pipeline.py
    python bench/kl_control.py --targets 1 3 6    # the targets (nats per response)

Uses the SFT and RM runs of bench/pipeline.py in --root (trains them first if missing). For each
target: train_ppo.py --kl_target T (out dir ppo_kl<T>); from its metrics.jsonl the mean KL of
the training rollouts over the last quarter of the run (the figure the controller steers) and
beta at the end; then the same held-out comparison as bench/pipeline.py (3,200 responses: gold
+- standard error, RM score, well_formed, distinct2, demo_loss) and the periodic evals
(gold against KL: the reward-vs-KL frontier). Writes bench/results/kl_control.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402
import results_file  # noqa: E402
from pipeline import comparison_prompts, held_out_figures, load_reward_model  # noqa: E402


def run_defaults() -> dict:
    """The options every run of this bench shares, as the run resolves them (check_config: the
    "auto" sentinels, such as --kl_coef -1, replaced by what the run trains with)."""
    cfg = train_ppo.Config()
    train_ppo.check_config(cfg)
    return {k: getattr(cfg, k) for k in ("kl_coef", "kl_horizon", "max_iters", "rollout_batch_size")}


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="out/bench", help="folder of bench/pipeline.py's runs")
    ap.add_argument("--targets", type=float, nargs="+", default=[1.0, 3.0, 6.0])
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--samples_per_prompt", type=int, default=16)
    args = ap.parse_args()
    r = lambda name: os.path.join(args.root, name)
    if not os.path.exists(os.path.join(r("sft"), "ckpt.pt")):
        train_sft.main(train_sft.Config(out_dir=r("sft"), seed=args.seed))
    if not os.path.exists(os.path.join(r("rm"), "ckpt.pt")):
        train_rm.main(train_rm.Config(out_dir=r("rm"), sft_dir=r("sft"), seed=args.seed))
    rm = load_reward_model(r("rm"))
    task = get_task("reviews", seed=args.seed)
    prompts = comparison_prompts(task, args.samples_per_prompt)
    demos = task.sft_examples("eval")
    rows = []
    for target in args.targets:
        out_dir = r(f"ppo_kl{target:g}")
        start = time.time()
        train_ppo.main(train_ppo.Config(out_dir=out_dir, sft_dir=r("sft"), rm_dir=r("rm"),
                                        seed=args.seed, kl_target=target))
        seconds = time.time() - start
        lines = read_metrics(out_dir)
        train = [e for e in lines if "kl_coef" in e]
        last_quarter = train[-len(train) // 4:]
        kl_last = sum(e["kl"] for e in last_quarter) / len(last_quarter)
        row = {"kl_target": target, "seconds": round(seconds, 1),
               "kl_last_quarter": round(kl_last, 3),
               "kl_vs_target": round(kl_last / target, 3),
               "beta_start": train[0]["kl_coef"], "beta_end": round(train[-1]["kl_coef"], 5),
               "frontier": [{"step": e["step"], "kl": round(e["kl"], 3), "gold": round(e["gold"], 4)}
                            for e in lines if e.get("split") == "eval"],
               "compared": held_out_figures(out_dir, rm, task, prompts, 1, args.seed, demos)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    import torch
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "defaults": run_defaults(), "measured": results_file.measured(ROOT), "rows": rows}
    path = os.path.join(ROOT, "bench", "results", "kl_control.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
