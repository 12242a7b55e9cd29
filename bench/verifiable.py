"""RL from rewards computed by code, measured against imitation and against a
learned reward.

    python bench/verifiable.py                          # both parts, 3 seeds (long on a CPU)
    python bench/verifiable.py --part sort --seeds 0    # one part, one seed
    python bench/verifiable.py --draw_only              # redraw the picture from the JSON

Part "sort" (the task with a checkable answer and a teacher wrong on 30 % of problems):
SFT from the teacher, then GRPO, RLOO and PPO (shared critic) trained on the exact-match
check (`--reward task`), every RL method with its script's defaults. Part "reviews": PPO and
GRPO on the reward model (`--reward rm`) and on the gold reward itself (`--reward task`),
from the same SFT checkpoint and RM: what learning the reward costs.

Each seed trains its own SFT (and RM) with that --seed; every run's result is kept in the
JSON as soon as it ends, and a run already there is not run again (--rerun to redo), so the
benchmark can be continued after an interruption. For each run: accuracy (sort; the held-out
eval's gold) or gold (reviews), well_formed, KL to the SFT policy, tokens generated in
training, wall seconds of the run; on the sort task also pass@1 and pass@8 on the 200
held-out problems (8 samples each at temperature 1: pass@8 is the share of problems with at
least one exact answer), since RL can raise pass@1 while narrowing what is sampled
(Yue et al. 2025). Writes bench/results/verifiable.json and verifiable.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from statistics import median

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402
from mingpt_rlhf.evaluate import sample_responses  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "verifiable.json")
PARTS = {  # part: {method: train_ppo options}
    "sort": {"grpo": dict(algo="grpo"), "rloo": dict(algo="rloo"),
             "ppo_shared": dict(algo="ppo", critic="shared")},
    "reviews": {"ppo_rm": dict(algo="ppo", reward="rm"), "ppo_gold": dict(algo="ppo"),
                "grpo_rm": dict(algo="grpo", reward="rm"), "grpo_gold": dict(algo="grpo")},
}


def run_figures(out_dir: str, seconds: float) -> dict:
    """Final eval figures, KL, tokens generated and seconds of a finished run."""
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    final = rows[-1]
    figures = {k: final[k] for k in ("gold", "gold_unseen", "well_formed", "kl", "distinct2")
               if k in final}
    figures["gen_tokens"] = sum(r.get("gen_tokens", 0) for r in rows if "pg_loss" in r)
    figures["seconds"] = round(seconds, 1)
    figures["frontier"] = [{"step": r["step"], "kl": r["kl"], "gold": r["gold"]}
                           for r in rows if r.get("split") == "eval" and "gold" in r and "kl" in r]
    return figures


@torch.no_grad()
def pass_at(out_dir: str, task, k: int = 8, seed: int = 0) -> dict:
    """pass@1 and pass@k on the task's held-out prompts, k samples each at temperature 1."""
    policy, tokenizer, _ = load_policy(out_dir, flag="--ckpt_dir")
    prompts = task.prompts("eval")
    repeated = [p for p in prompts for _ in range(k)]
    responses = sample_responses(policy, tokenizer, repeated, 16,
                                 generator=torch.Generator().manual_seed(seed))
    right = [task.check(p, r) for p, r in zip(repeated, responses)]
    per_prompt = [any(right[i * k:(i + 1) * k]) for i in range(len(prompts))]
    figures = {"pass@1": sum(right) / len(right), f"pass@{k}": sum(per_prompt) / len(prompts)}
    # the problems whose digits training never holds, in any order (task_sort.py)
    unseen = [ok for p, ok in zip(repeated, right) if task.unseen(p)]
    if unseen:
        figures["pass@1_unseen"] = sum(unseen) / len(unseen)
    return figures


def timed(fn, cfg) -> float:
    start = time.time()
    fn(cfg)
    return time.time() - start




def summarise(result: dict) -> None:
    """Per (part, method): mean and range over seeds of each figure."""
    summary = {}
    for key, run in result["runs"].items():
        part, method, _ = key.split("/")
        summary.setdefault(f"{part}/{method}", []).append(run)
    result["summary"] = {}
    for name, runs in sorted(summary.items()):
        figures = {}
        for k in ("gold", "well_formed", "kl", "gen_tokens", "seconds", "pass@1", "pass@8"):
            values = [r[k] for r in runs if k in r]
            if values:
                figures[k] = {"mean": sum(values) / len(values), "min": min(values),
                              "max": max(values)}
        figures["seeds"] = len(runs)
        result["summary"][name] = figures


def draw(result: dict, png: str) -> None:
    """Left, sort: held-out accuracy against RL iterations, each method's mean over seeds (the
    band: min to max). Right, reviews: held-out gold at each eval, median over seeds, trained on
    the RM (solid) and on the gold reward itself (dashed), with each method's final KL."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = {}
    for key, run in result["runs"].items():
        part, method, _ = key.split("/")
        methods.setdefault((part, method), []).append(run)
    colours = {"grpo": "C0", "rloo": "C1", "ppo_shared": "C2", "ppo": "C2"}
    for (part, method), runs in sorted(methods.items()):
        frontiers = [r["frontier"] for r in runs if r.get("frontier")]
        if method == "sft":  # iteration 0 of each RL run is the SFT policy
            continue
        if not frontiers:
            continue
        n = min(len(f) for f in frontiers)
        steps = [frontiers[0][i]["step"] for i in range(n)]
        gold = [[f[i]["gold"] for f in frontiers] for i in range(n)]
        if part == "sort":
            mean = [sum(g) / len(g) for g in gold]
            axes[0].plot(steps, mean, marker=".", color=colours.get(method), label=method)
            axes[0].fill_between(steps, [min(g) for g in gold], [max(g) for g in gold],
                                 color=colours.get(method), alpha=0.15)
        else:
            algo, reward = method.split("_")
            # medians: one seed's eval can sit far off (a spike that recovers, kl 36) and
            # would drag a mean across the picture
            # against the iteration, not the KL: each run's evals then read left to right
            # (drawn against the KL, a run that moves back and forth in KL crosses itself)
            kl = median(f[n - 1]["kl"] for f in frontiers)
            axes[1].plot(steps, [median(g) for g in gold], marker=".", color=colours.get(algo),
                         ls="-" if reward == "rm" else "--",
                         label=f"{algo} on the {'reward model' if reward == 'rm' else 'gold reward'}"
                               f" (final KL {kl:.1f})")
    seeds = len(methods.get(("sort", "grpo"), []))
    axes[0].set(xlabel="RL iteration (0: the SFT policy, imitating the teacher)",
                ylabel="held-out exact-match accuracy",
                title=f"sort: RL on the check ({seeds} seeds, mean; band min-max)")
    # the SFT policy's gold (about 0) would squeeze the part where the methods differ
    axes[1].set_ylim(0.6, 1.01)
    axes[1].text(2, 0.61, "iteration 0 (the SFT policy): gold about 0, below the axis", fontsize=7)
    axes[1].set(xlabel="RL iteration", ylabel="held-out gold reward",
                title="reviews: trained on the RM vs on the gold reward (median of seeds)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.title.set_fontsize(10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=list(PARTS), nargs="*", default=list(PARTS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--root", default=os.path.join(ROOT, "out", "bench_verifiable"))
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has")
    ap.add_argument("--draw_only", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    result = results_file.load(RESULTS)
    png = os.path.join(ROOT, "bench", "results", "verifiable.png")
    if not args.draw_only:
        for seed in args.seeds:
            for part in args.part:
                root = os.path.join(args.root, f"{part}_seed{seed}")
                task = get_task(part, seed=seed)
                sft_dir = os.path.join(root, "sft")
                key = f"{part}/sft/{seed}"
                if args.rerun or key not in result["runs"]:
                    seconds = timed(train_sft.main, train_sft.Config(out_dir=sft_dir, task=part, seed=seed))
                    run = run_figures(sft_dir, seconds)
                    if part == "sort":
                        run.update(pass_at(sft_dir, task, seed=seed))
                    result["runs"][key] = run
                    results_file.save(RESULTS, result)
                if part == "reviews" and not os.path.exists(os.path.join(root, "rm", "ckpt.pt")):
                    train_rm.main(train_rm.Config(out_dir=os.path.join(root, "rm"), sft_dir=sft_dir,
                                                  seed=seed))
                for method, options in PARTS[part].items():
                    key = f"{part}/{method}/{seed}"
                    if key in result["runs"] and not args.rerun:
                        continue
                    out_dir = os.path.join(root, method)
                    options = {"reward": "task", **options}
                    cfg = train_ppo.Config(out_dir=out_dir, sft_dir=sft_dir, task=part, seed=seed,
                                           rm_dir=os.path.join(root, "rm"), **options)
                    run = run_figures(out_dir, timed(train_ppo.main, cfg))
                    if part == "sort":
                        run.update(pass_at(out_dir, task, seed=seed))
                    result["runs"][key] = run
                    results_file.save(RESULTS, result)
                    print(json.dumps({key: {k: v for k, v in run.items() if k != "frontier"}}))
        summarise(result)
        results_file.save(RESULTS, result)
    try:
        draw(result, png)
    except ImportError:
        print("matplotlib is not installed: no picture")
    for name, figures in result.get("summary", {}).items():
        print(name, {k: (round(v["mean"], 3) if isinstance(v, dict) else v) for k, v in figures.items()})


if __name__ == "__main__":
    main()
