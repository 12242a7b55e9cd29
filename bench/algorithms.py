"""PPO, GRPO, Dr. GRPO, RLOO, DPO, online DPO and best-of-n on the built-in task, judged by the gold reward.

    python bench/algorithms.py                     # 3 seeds, ~1 h on 2 CPU cores
    python bench/algorithms.py --seeds 1 --methods grpo rloo

Every method starts from the same SFT checkpoint and (the RL methods) the same reward model:
those of bench/pipeline.py in --root (trained first if missing). Each method runs with its
script's defaults; only --seed changes between seeds. Three more rows take GRPO apart:
GRPO as published (each group's rewards divided by their std, KL in the loss as k3 per
token), and each of those two choices alone. For each run:
- cost: wall seconds on this machine and the tokens generated during training (gen_tokens
  summed over iterations; DPO generates none, it only evaluates);
- quality, on the same 3,200 held-out responses as bench/pipeline.py (PPO's 200 eval prompts,
  16 samples each): gold +- standard error, RM score, well_formed, distinct2;
- KL to the SFT policy: the run's final eval (200 responses, nats per response);
- the reward-vs-KL frontier: (kl, gold) of every periodic eval of the run.
Best-of-n (n = 1, 4, 16) samples the SFT policy and keeps the RM's favourite; its KL to the
SFT policy is the analytic log n - (n - 1) / n (Stiennon et al. 2020), an upper bound.
Writes bench/results/algorithms.json: every run, and per method the mean over seeds.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import train_dpo  # noqa: E402
import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402
from pipeline import comparison_prompts, held_out_figures, load_reward_model  # noqa: E402

METHODS = {  # name: (script, options beyond the defaults)
    "ppo": (train_ppo, {}),
    "grpo": (train_ppo, {"algo": "grpo"}),  # defaults: Dr. GRPO's normalisation, KL in the reward
    "rloo": (train_ppo, {"algo": "rloo"}),
    "dpo": (train_dpo, {}),
    # DPO's loss on pairs the policy samples itself, ranked by the reward model
    "online_dpo": (train_ppo, {"algo": "online_dpo"}),
    "online_dpo_beta1": (train_ppo, {"algo": "online_dpo", "dpo_beta": 1.0}),  # a stronger KL
    # the best and the worst of 4 samples: pairs further apart in reward
    "online_dpo_beta1_g4": (train_ppo, {"algo": "online_dpo", "dpo_beta": 1.0, "group_size": 4}),
    # a KL near PPO's: beta 2, pairs of 2 and the best and worst of 4
    "online_dpo_beta2": (train_ppo, {"algo": "online_dpo", "dpo_beta": 2.0}),
    "online_dpo_beta2_g4": (train_ppo, {"algo": "online_dpo", "dpo_beta": 2.0, "group_size": 4}),
    # one pass over each batch's pairs instead of --ppo_epochs 4
    "online_dpo_e1": (train_ppo, {"algo": "online_dpo", "ppo_epochs": 1}),
    "online_dpo_beta1_e1": (train_ppo, {"algo": "online_dpo", "dpo_beta": 1.0, "ppo_epochs": 1}),
    # GRPO as published, and the two halves of the difference. The std with the KL in the
    # reward ("grpo_std_kl_reward" in results/algorithms.json, committed on 2026-11-23) is no
    # longer run: train_ppo.py refuses the pairing (a tied group's KL noise would be scaled
    # up to +-1 advantages)
    "grpo_std_kl_loss": (train_ppo, {"algo": "grpo", "grpo_norm": "grpo", "kl_in": "loss"}),
    "dr_grpo_kl_loss": (train_ppo, {"algo": "grpo", "kl_in": "loss"}),
}


def draw_frontier(result: dict, png: str) -> None:
    """Gold against KL to the SFT policy: each RL method's periodic evals (mean over seeds at
    each eval), its final figure on the 3,200 responses (a large dot), best-of-n's points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 5))
    for method, figures in result["summary"].items():
        rows = [x for x in result["runs"] if x["method"] == method]
        if method.startswith("best_of"):
            ax.scatter([figures["kl"]], [figures["gold"]], marker="s", color="black", zorder=3)
            ax.annotate(method.replace("_", "-"), (figures["kl"], figures["gold"]),
                        textcoords="offset points", xytext=(5, -10), fontsize=8)
            continue
        steps = sorted({e["step"] for e in rows[0]["frontier"]})
        at = lambda step, key: [e[key] for x in rows for e in x["frontier"] if e["step"] == step]  # noqa: E731
        kl = [sum(at(st, "kl")) / len(at(st, "kl")) for st in steps]
        gold = [sum(at(st, "gold")) / len(at(st, "gold")) for st in steps]
        line, = ax.plot(kl, gold, marker=".", linewidth=1, alpha=0.8,
                        linestyle="-" if method in ("ppo", "grpo", "rloo", "dpo") else ":",
                        label=f"{method} (final gold {figures['gold']:.3f})")
        ax.scatter([figures["kl"]], [figures["gold"]], s=60, color=line.get_color(), zorder=3)
    ax.set_xlabel("KL to the SFT policy (nats per response)")
    ax.set_ylabel("gold reward")
    ax.set_title("Reward-vs-KL frontier on the built-in task (evals: mean of 3 seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def mean_and_stderr(values):
    m = sum(values) / len(values)
    if len(values) < 2:
        return round(m, 4), None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return round(m, 4), round(math.sqrt(var / len(values)), 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="out/bench", help="folder of bench/pipeline.py's SFT and RM")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per method (1337, 1338, ...)")
    ap.add_argument("--first_seed", type=int, default=1337, help="the first of the --seeds seeds")
    ap.add_argument("--methods", nargs="+", default=list(METHODS) + ["best_of_n"],
                    choices=list(METHODS) + ["best_of_n"])
    ap.add_argument("--samples_per_prompt", type=int, default=16)
    ap.add_argument("--draw_only", action="store_true",
                    help="only redraw bench/results/algorithms_frontier.png from the JSON (needs matplotlib)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the runs already in the JSON that this invocation does not redo")
    args = ap.parse_args()
    path = os.path.join(ROOT, "bench", "results", "algorithms.json")
    if args.draw_only:
        with open(path) as f:
            return draw_if_possible(json.load(f))
    r = lambda name: os.path.join(args.root, name)
    seed0 = 1337  # the SFT and RM seed, and the first method seed
    if not os.path.exists(os.path.join(r("sft"), "ckpt.pt")):
        train_sft.main(train_sft.Config(out_dir=r("sft"), seed=seed0))
    if not os.path.exists(os.path.join(r("rm"), "ckpt.pt")):
        train_rm.main(train_rm.Config(out_dir=r("rm"), sft_dir=r("sft"), seed=seed0))
    rm = load_reward_model(r("rm"))
    task = get_task("reviews", seed=seed0)
    prompts = comparison_prompts(task, args.samples_per_prompt)
    demos = task.sft_examples("eval")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs = []
    if args.reuse and os.path.exists(path):
        with open(path) as f:
            runs = [x for x in json.load(f)["runs"]
                    if not (x["method"] in args.methods and (x["seed"] in seeds
                                                             or x["method"].startswith("best_of")))]

    for name in [m for m in args.methods if m in METHODS]:
        module, options = METHODS[name]
        for seed in seeds:
            out_dir = r(f"{name}_s{seed}")
            common = dict(out_dir=out_dir, sft_dir=r("sft"), seed=seed, **options)
            if module is train_ppo:
                common["rm_dir"] = r("rm")
            start = time.time()
            module.main(module.Config(**common))
            seconds = time.time() - start
            lines = read_metrics(out_dir)
            evals = [e for e in lines if e.get("split") == "eval"]
            run = {"method": name, "seed": seed, "seconds": round(seconds, 1),
                   "gen_tokens": int(sum(e.get("gen_tokens", 0) for e in lines)),
                   "kl": round(evals[-1]["kl"], 3),
                   "frontier": [{"step": e["step"], "kl": round(e["kl"], 3),
                                 "gold": round(e["gold"], 4)} for e in evals],
                   **held_out_figures(out_dir, rm, task, prompts, 1, seed0, demos)}
            print(json.dumps({k: v for k, v in run.items() if k != "frontier"}), flush=True)
            runs.append(run)
    if "best_of_n" in args.methods:
        for n in (1, 4, 16):
            start = time.time()
            figures = held_out_figures(r("sft"), rm, task, prompts, n, seed0, demos)
            runs.append({"method": f"best_of_{n}", "seed": seed0,
                         "seconds": round(time.time() - start, 1),
                         "gen_tokens": None,  # no training; sampling cost is per answer
                         "kl": round(math.log(n) - (n - 1) / n, 3), **figures})
            print(json.dumps(runs[-1]), flush=True)

    summary = {}
    for method in dict.fromkeys(x["method"] for x in runs):
        rows = [x for x in runs if x["method"] == method]
        gold, gold_se = mean_and_stderr([x["gold"] for x in rows])
        summary[method] = {
            "seeds": len(rows), "gold": gold,
            "gold_stderr": gold_se if gold_se is not None else rows[0]["gold_stderr"],
            **{k: mean_and_stderr([x[k] for x in rows])[0]
               for k in ("rm_score", "kl", "well_formed", "distinct2", "seconds")},
            "gen_tokens": rows[0]["gen_tokens"] and mean_and_stderr([x["gen_tokens"] for x in rows])[0]}
    import torch
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "prompts": len(prompts) // args.samples_per_prompt,
              "samples_per_prompt": args.samples_per_prompt, "summary": summary, "runs": runs}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")
    draw_if_possible(result)


def draw_if_possible(result: dict) -> None:
    try:
        draw_frontier(result, os.path.join(ROOT, "bench", "results", "algorithms_frontier.png"))
    except ImportError:
        print('no picture: pip install -e ".[plot]" for matplotlib')


if __name__ == "__main__":
    main()
