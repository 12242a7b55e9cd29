"""What each implementation detail of PPO and GRPO is worth: the default run with one detail
taken out, judged by the gold reward, 3 seeds.

    python bench/details.py                         # every detail, seeds 0 1 2 (about an hour
                                                    # of PPO and a quarter of GRPO a seed, on
                                                    # 2 CPU cores; docs/details.md)
    python bench/details.py --seeds 0 --details no_whiten no_kl
    python bench/details.py --draw_only --table     # docs/details.md's tables and
                                                    # bench/results/details.png, from the JSON

For each seed: SFT and the reward model with the scripts' defaults and that --seed (and a
second reward model without its normalisation, for `rm_unnormalised`), then the default PPO
run (`baseline`) and one run per detail below, each the default run with that one thing
changed. Figures per run, from its final eval on the 200 held-out prompts: gold, rm_score,
well_formed, KL to the SFT policy, distinct2 (collapse into repetition shows here); and the
run's wall seconds and skipped updates. Every run is written to bench/results/details.json
as soon as it ends and is not run again (--rerun to redo): a killed bench continues where it
stopped, and a bench may span several sittings.

The critic-free details (the `sort_` runs): the sort task's SFT with that --seed, then GRPO's
default run on sort trained on the exact check (`--reward task`), and one run per detail; the
gold there is the held-out exact-match accuracy.

Details that have an option are changed through it; the others (whitening, dropout) through a
patch of the one function that does them, named beside each.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf import losses  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "details.json")
# --results: another file, for a second process running other seeds at the same time; --merge
# adds such files' runs to RESULTS


@contextlib.contextmanager
def no_whitening():
    """Advantages used as GAE gives them (losses.py's gae entry calls ppo.masked_whiten)."""
    real = losses.masked_whiten
    losses.masked_whiten = lambda x, mask, *a, **k: x * mask
    try:
        yield
    finally:
        losses.masked_whiten = real


@contextlib.contextmanager
def dropout_on(p: float = 0.1):
    """The actor trains with dropout p, as a model fine-tuned with its pretraining dropout would
    (train_ppo.load_models turns it off; here it is turned back on, in training mode)."""
    real = train_ppo.load_models

    def load(cfg, device, dtype):
        tokenizer, actor, *rest = real(cfg, device, dtype)
        actor.set_dropout(p)
        actor.train()  # sampling switches to eval mode and back; the learner's passes drop out
        return (tokenizer, actor, *rest)
    train_ppo.load_models = load
    try:
        yield
    finally:
        train_ppo.load_models = real


# name: (what it changes, train_ppo options, patch or None)
DETAILS = {
    "baseline": ("the default run", {}, None),
    "no_kl": ("no KL penalty (beta 0, no controller)", dict(kl_coef=0.0, adaptive_kl=False), None),
    "fixed_kl": ("a fixed beta 0.05 instead of the adaptive controller", dict(adaptive_kl=False), None),
    "no_reward_clip": ("the RM's scores unclipped", dict(reward_clip=0.0), None),
    "no_whiten": ("advantages not whitened", {}, no_whitening),
    "no_value_clip": ("the value loss unclipped", dict(clip_range_value=1e6), None),
    "no_policy_clip": ("the ratio unclipped", dict(clip_range=1e6), None),
    "lam_1": ("GAE lambda 1 (Monte-Carlo returns minus the value)", dict(lam=1.0), None),
    "gamma_0.9": ("a discount of 0.9 per token", dict(gamma=0.9), None),
    "no_ptx": ("no ptx loss", dict(ptx_coef=0.0), None),
    "no_target_kl": ("no early stop of an update on approx-KL", dict(target_kl=0.0), None),
    "one_minibatch": ("one minibatch of 64 per epoch (4 steps an update, not 16)",
                      dict(minibatch_size=64), None),
    "critic_from_zero": ("a value head on the actor started at zero, not a critic from the RM",
                         dict(critic="shared"), None),
    "top_k_10": ("sampling from the 10 likeliest tokens, log-probs of the full distribution",
                 dict(top_k=10), None),
    "entropy_bonus": ("an entropy bonus of 0.01 (off by default)", dict(entropy_coef=0.01), None),
    "dropout": ("dropout 0.1 in the actor while it learns", {}, dropout_on),
    "rm_unnormalised": ("the reward model's scores not normalised", dict(rm="unnormalised"), None),
}

# The critic-free details: GRPO (Dr. GRPO, the script's default) on the sort task, rewarded by
# the exact check (--reward task), so the reward itself is the truth. Same shape as DETAILS.
SORT_DETAILS = {
    "sort_baseline": ("GRPO's default run on sort", {}, None),
    "sort_std_norm": ("the paper's GRPO: advantages divided by the group's std, per-response "
                      "token means, KL (k3) in the loss", dict(grpo_norm="grpo"), None),
    "sort_no_kl": ("no KL penalty (beta 0, no controller)",
                   dict(kl_coef=0.0, adaptive_kl=False), None),
    "sort_kl_in_loss": ("the KL as beta * k3 per token in the loss, not in the reward",
                        dict(kl_in="loss"), None),
    "sort_token_mean": ("token losses averaged over the minibatch's tokens (not summed per "
                        "response and divided by the token budget)", dict(reduction="token"), None),
    "sort_no_policy_clip": ("the ratio unclipped", dict(clip_range=1e6), None),
    "sort_one_epoch": ("one pass over each rollout (4 by default)", dict(ppo_epochs=1), None),
    "sort_no_target_kl": ("no early stop of an update on approx-KL", dict(target_kl=0.0), None),
    "sort_group_2": ("groups of 2 responses (32 prompts a batch), not 8 (8 prompts)",
                     dict(group_size=2), None),
}
ALL_DETAILS = {**DETAILS, **SORT_DETAILS}




def merge(paths: list[str]) -> None:
    """Add the runs of other results files (seeds run by another process) to RESULTS."""
    result = results_file.merge(RESULTS, paths)
    summarise(result)
    results_file.save(RESULTS, result)


def stages(seed: int, root: str, names: list[str]) -> None:
    """What the runs `names` of `seed` start from, each trained unless already finished: SFT,
    the RM and the unnormalised RM on reviews; the sort task's SFT in root/sort_sft."""
    if any(n in SORT_DETAILS for n in names):
        results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "sort_sft"),
                                 task="sort", seed=seed)
    if not any(n in DETAILS for n in names):
        return
    results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "sft"), seed=seed)
    for name, extra in (("rm", {}), ("rm_unnormalised", dict(norm_samples=0))):
        results_file.train_stage(train_rm.main, train_rm.Config, os.path.join(root, name),
                                 seed=seed, sft_dir=os.path.join(root, "sft"), **extra)


def run(seed: int, root: str, name: str) -> dict:
    _, options, patch = ALL_DETAILS[name]
    options = dict(options)
    rm = os.path.join(root, "rm_unnormalised" if options.pop("rm", "") else "rm")
    sft = os.path.join(root, "sft")
    if name in SORT_DETAILS:
        options = dict(algo="grpo", task="sort", reward="task", **options)
        sft = os.path.join(root, "sort_sft")
    out = os.path.join(root, name)
    start = time.time()
    with (patch() if patch else contextlib.nullcontext()):
        train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft, rm_dir=rm, seed=seed, **options))
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    final = rows[-1]
    figures = {k: final[k] for k in ("gold", "rm_score", "well_formed", "kl", "distinct2",
                                     "skipped_updates") if k in final}
    figures["seconds"] = round(time.time() - start, 1)
    figures["evals"] = [{"step": r["step"], "gold": r["gold"], "kl": r["kl"]}
                        for r in rows if r.get("split") == "eval" and "gold" in r]
    return figures


def summarise(result: dict) -> None:
    by = {}
    for key, r in result["runs"].items():
        by.setdefault(key.split("/")[0], []).append(r)
    result["summary"] = {}
    for name, runs in by.items():
        s = {"seeds": len(runs), "what": ALL_DETAILS[name][0] if name in ALL_DETAILS else ""}
        for k in ("gold", "rm_score", "kl", "distinct2", "seconds"):
            v = [r[k] for r in runs if k in r]
            if v:
                s[k] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
        result["summary"][name] = s


def markdown_table(result: dict, details: dict = DETAILS) -> str:
    """A table of docs/details.md: per detail, gold, RM score, KL and distinct2 as the mean over
    the seeds run so far [their range], and the gold's change from the baseline (the first
    entry of `details`). On sort the gold is the exact-match accuracy and there is no RM."""
    summary = result["summary"]
    first = next(iter(details))
    base = summary.get(first, {}).get("gold", {}).get("mean")
    sort = details is SORT_DETAILS
    lines = ["| run | what changes | seeds | " + ("accuracy" if sort else "gold") + " | change | "
             + ("" if sort else "RM score | ") + "KL | distinct2 |",
             "| --- " * (7 if sort else 8) + "|"]

    def cell(s, k, digits=3):
        if k not in s:
            return ""
        v = s[k]
        if s["seeds"] == 1:
            return f"{v['mean']:.{digits}f}"
        return f"{v['mean']:.{digits}f} [{v['min']:.{digits}f}, {v['max']:.{digits}f}]"
    for name in details:
        if name not in summary:
            continue
        s = summary[name]
        change = "" if base is None or name == first else f"{s['gold']['mean'] - base:+.3f}"
        lines.append(f"| `{name}` | {details[name][0]} | {s['seeds']} | {cell(s, 'gold')} | "
                     f"{change} | " + ("" if sort else f"{cell(s, 'rm_score', 2)} | ")
                     + f"{cell(s, 'kl', 2)} | {cell(s, 'distinct2')} |")
    return "\n".join(lines)


def draw(result: dict, png: str) -> None:
    """Gold (sort: accuracy) against the final KL, one point per run name at its mean over the
    seeds, with bars spanning the seeds' lowest and highest; left PPO on reviews, right GRPO on
    sort; the baseline's gold range shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, details, title in ((axes[0], DETAILS, "PPO on reviews (gold reward)"),
                               (axes[1], SORT_DETAILS, "GRPO on sort (exact-match accuracy)")):
        summary = {n: result["summary"][n] for n in details if n in result["summary"]}
        first = next(iter(details))
        if first in summary:
            g = summary[first]["gold"]
            ax.axhspan(g["min"], g["max"], color="0.85", label="baseline's seed range")
        outside = []
        for i, (name, s) in enumerate(summary.items()):
            if "gold" not in s or "kl" not in s:
                continue
            g, k = s["gold"], s["kl"]
            if details is DETAILS and (g["min"] < 0.5 or k["max"] > 8):  # off the zoomed axes
                outside.append(f"{name}: gold {g['mean']:.2f} [{g['min']:.2f}, {g['max']:.2f}], "
                               f"KL {k['mean']:.1f} [{k['min']:.1f}, {k['max']:.1f}]")
                continue
            ax.errorbar(k["mean"], g["mean"], xerr=[[k["mean"] - k["min"]], [k["max"] - k["mean"]]],
                        yerr=[[g["mean"] - g["min"]], [g["max"] - g["mean"]]], fmt="osD^v"[i // 10],
                        ms=5, capsize=2, color=f"C{i % 10}", label=f"{name} ({s['seeds']})")
        if outside:
            ax.text(0.02, 0.03, "off the axes: " + "; ".join(outside), transform=ax.transAxes,
                    fontsize=7)
        ax.set_xlabel("KL to the SFT policy at the end (nats per response)")
        ax.set_ylabel("accuracy" if details is SORT_DETAILS else "gold")
        ax.set_title(title + ": each detail taken out", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    global RESULTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--details", nargs="+", default=list(ALL_DETAILS), choices=list(ALL_DETAILS),
                    help="which runs (default: all; the sort_ ones are GRPO on the sort task)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"))
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--draw_only", action="store_true", help="only summarise the JSON and draw "
                                                                "the picture")
    ap.add_argument("--table", action="store_true", help="print docs/details.md's table")
    ap.add_argument("--results", default=RESULTS, help="the JSON to write (another file lets a "
                                                        "second process run other seeds at once)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--merge", nargs="+", default=[], help="add these results files' runs to "
                                                           "bench/results/details.json and stop")
    args = ap.parse_args()
    RESULTS = os.path.abspath(args.results)
    if args.merge:
        RESULTS = os.path.join(ROOT, "bench", "results", "details.json")
        return merge(args.merge)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    result = results_file.load(RESULTS)
    if not args.draw_only:
        for seed in args.seeds:
            root = os.path.join(args.work, f"seed{seed}")
            stages(seed, root, args.details)
            for name in args.details:
                key = f"{name}/{seed}"
                if key in result["runs"] and not args.rerun:
                    continue
                result["runs"][key] = run(seed, root, name)
                summarise(result)
                results_file.save(RESULTS, result)
    summarise(result)
    results_file.save(RESULTS, result)
    try:
        draw(result, os.path.join(ROOT, "bench", "results", "details.png"))
    except ImportError:
        print("matplotlib is not installed: no picture")
    if args.table:
        print(markdown_table(result) + "\n\n" + markdown_table(result, SORT_DETAILS))
        return
    for name, s in result["summary"].items():
        print(f"{name:18s} " + ", ".join(f"{k} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]"
                                         for k, v in s.items() if isinstance(v, dict)))


if __name__ == "__main__":
    main()
