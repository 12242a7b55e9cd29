"""The refinements of GRPO (and PPO) ranked on the true reward: each alone against plain GRPO,
on the sort task and on the reviews task (trained on the reward model, and on the gold reward
itself), 3 seeds.

    python bench/refinements.py                        # everything (~50 min of runs a seed on
                                                       # 2 CPU cores)
    python bench/refinements.py --tasks sort --seeds 0 --runs grpo dynamic
    python bench/refinements.py --draw_only --table    # docs/methods.md's table and the picture

Every run starts from the SFT (and reward model) that bench/details.py trains for that seed,
in the same --work folder (trained here if missing), and is train_ppo.py with its defaults and
one change (RUNS below). On reviews the runs are 100 iterations, half the default (stated in
the table; the plain GRPO run is measured at the same budget). Figures from each run's final
eval: gold (on sort the held-out exact-match accuracy; on reviews the gold reward, whatever
the run was trained on), KL to the SFT policy, seconds, tokens generated in training, and the
mean share of groups with no signal (`zero_groups`: every score equal). Every run is written
to bench/results/refinements.json as soon as it ends and not run again (--rerun to redo): a
killed bench continues. Seeds are the outer loop, so a partial bench covers every task.

Before the runs, `mismatch` measures how far the sampler's log-probs are from the learner's
on each seed's reviews SFT policy, for the two cases truncated importance sampling is for:
the same weights under bfloat16 (the KV-cached sampler against one full forward pass), and a
sampler one update behind the learner (`--sampler_lag 1`; from the lagged run's own logs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import details  # noqa: E402
import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "refinements.json")
REVIEWS_ITERS = 100
# name: (what it is, train_ppo options on top of --algo grpo)
RUNS = {
    "grpo": ("plain GRPO (Dr. GRPO, the script's default)", {}),
    "clip_higher": ("DAPO's clip-higher: the ratio's upper clip 1.28, lower 0.8",
                    dict(clip_range_high=0.28)),
    "gspo": ("GSPO: one ratio per response, clipped to [1 - 3e-4, 1 + 4e-4]",
             dict(ratio="sequence", clip_range=3e-4, clip_range_high=4e-4)),
    "dynamic": ("DAPO's dynamic sampling: groups with no signal dropped, up to 2 refills",
                dict(dynamic_sampling=2)),
    "overlong": ("DAPO's overlong shaping over the last 8 of 32 tokens", dict(overlong_buffer=8)),
    "reinforce++": ("REINFORCE++: per-token KL reward, returns whitened over the batch, no "
                    "groups (64 prompts a batch, not 8 x 8)", dict(algo="reinforce++")),
    "top_entropy": ("only the top 20 % of each rollout's tokens by entropy learn (the KL in "
                    "the reward, GRPO's default here)", dict(learn_tokens="top_entropy")),
    "top_entropy_kl_loss": ("the same top 20 %, with the KL in the loss (k3) instead",
                            dict(learn_tokens="top_entropy", kl_in="loss")),
    "lag": ("a sampler one update behind the learner, uncorrected", dict(sampler_lag=1)),
    "lag_tis": ("the same lagging sampler, with truncated importance sampling (cap 2)",
                dict(sampler_lag=1, tis_cap=2.0)),
}
TASKS = {  # name: train_ppo options of the task
    "sort": dict(task="sort", reward="task"),
    "reviews_gold": dict(task="reviews", reward="task", max_iters=REVIEWS_ITERS),
    "reviews_rm": dict(task="reviews", reward="rm", max_iters=REVIEWS_ITERS),
}


@torch.no_grad()
def bf16_mismatch(sft_dir: str, seed: int, prompts: int = 64) -> dict:
    """The reviews SFT policy samples `prompts` responses under bfloat16 autocast (CPU), keeping
    the sampler's log-probs; one full forward pass under the same autocast, and one in float32,
    score the same tokens. Per token: mean |log-ratio| and the k3 KL estimate, sampler against
    each; and the same sampler-vs-learner figures in float32 (the pair the trainer reuses)."""
    from mingpt_rlhf.stages import load_policy
    from mingpt_rlhf.data import left_pad
    from mingpt_rlhf.logprobs import sequence_logprobs
    from mingpt_rlhf.lab.offpolicy import correct
    from mingpt_rlhf.sampling import generate
    from mingpt_rlhf.tasks import get_task
    policy, tokenizer, _ = load_policy(sft_dir)
    policy.eval()
    task = get_task("reviews", seed=seed)
    rows = [tokenizer.encode(p) for p in task.prompts("eval")[:prompts]]
    ids, mask = left_pad(rows, tokenizer.pad_id)
    # the sampler never writes a PAD of its own; the learner's log-probs leave it out the same way
    suppress = tokenizer.pad_id if tokenizer.pad_id != tokenizer.eos_id else None
    figures = {}
    for name, ctx in (("bfloat16", lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
                      ("float32", lambda: torch.autocast("cpu", enabled=False))):
        gen = torch.Generator().manual_seed(seed)
        with ctx():
            out = generate(policy, ids, mask, 32, eos_token_id=tokenizer.eos_id,
                           pad_token_id=tokenizer.pad_id, generator=gen, score=True)
        T = out.prompt_len
        action = out.action_mask[:, T:].float()
        for learner, lctx in (("same_dtype", ctx), ("float32_pass", lambda: torch.autocast("cpu", enabled=False))):
            with lctx():
                lp = sequence_logprobs(policy, out.sequences, out.attention_mask, T,
                                       suppress=suppress)[0].float()
            _, f = correct("none", lp * action, out.logprobs.float() * action, action, 0)
            figures[f"{name}_sampler_vs_{learner}"] = {k: f[k] for k in ("mismatch_kl", "mismatch_abs")}
    return figures


def run(seed: int, root: str, task: str, name: str) -> dict:
    sft = os.path.join(root, "sort_sft" if task == "sort" else "sft")
    options = {"algo": "grpo", **TASKS[task], **RUNS[name][1]}
    out = os.path.join(root, "refinements", f"{task}_{name}")
    start = time.time()
    train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft, rm_dir=os.path.join(root, "rm"),
                                    seed=seed, **options))
    seconds = time.time() - start
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    train = [r for r in rows if "pg_loss" in r or "minibatch_steps" in r]
    final = rows[-1]
    figures = {k: final[k] for k in ("gold", "gold_unseen", "well_formed", "kl", "distinct2")
               if k in final}
    figures["seconds"] = round(seconds, 1)
    figures["gen_tokens"] = sum(r.get("gen_tokens", 0) for r in train)
    figures["kl_max"] = max(r["kl"] for r in train)  # the highest KL to the SFT policy on the way
    for k in ("zero_groups", "mismatch_kl", "tis_capped"):
        # (the share of capped weights is logged as is_cut since the table of corrections)
        v = [r[k] if k in r else r["is_cut"] for r in train if k in r or (k == "tis_capped" and "is_cut" in r)]
        if v:
            figures[k] = sum(v) / len(v)
    figures["curve"] = [{"step": r["step"], "gold": r["gold"], "kl": r["kl"]}
                        for r in rows if r.get("split") == "eval" and "gold" in r]
    figures["zero_groups_curve"] = [[r["step"], r["zero_groups"]] for r in train if "zero_groups" in r]
    return figures


def summarise(result: dict) -> None:
    by = {}
    for key, r in result["runs"].items():
        task, name, _ = key.split("/")
        by.setdefault(f"{task}/{name}", []).append(r)
    result["summary"] = {}
    for key, runs in by.items():
        s = {"seeds": len(runs)}
        for k in ("gold", "kl", "kl_max", "seconds", "gen_tokens", "zero_groups", "mismatch_kl"):
            v = [r[k] for r in runs if k in r]
            if v:
                s[k] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
        result["summary"][key] = s


def verdict(s: dict, base: dict) -> str:
    """'helps' / 'hurts' when every seed's gold is above (below) every seed of plain GRPO's,
    else 'no difference here'; with fewer than 3 seeds of either, 'open'."""
    if s["seeds"] < 3 or base["seeds"] < 3:
        return "open"
    if s["gold"]["min"] > base["gold"]["max"]:
        return "helps"
    if s["gold"]["max"] < base["gold"]["min"]:
        return "hurts"
    return "no difference here"


def markdown_table(result: dict) -> str:
    """Per task and run: gold (mean [range]), its change from plain GRPO, KL, seconds, tokens,
    zero_groups, the verdict."""
    lines = ["| task | run | seeds | gold | change | KL | seconds | tokens | no-signal groups | verdict |",
             "| --- " * 10 + "|"]
    summary = result["summary"]

    def cell(s, k, digits=3):
        if k not in s:
            return ""
        v = s[k]
        return f"{v['mean']:.{digits}f} [{v['min']:.{digits}f}, {v['max']:.{digits}f}]"
    for task in TASKS:
        base = summary.get(f"{task}/grpo")
        for name in RUNS:
            s = summary.get(f"{task}/{name}")
            if s is None:
                continue
            change = "" if base is None or name == "grpo" else f"{s['gold']['mean'] - base['gold']['mean']:+.3f}"
            lines.append(f"| {task} | `{name}` | {s['seeds']} | {cell(s, 'gold')} | {change} | "
                         f"{cell(s, 'kl', 2)} | {s['seconds']['mean']:.0f} | "
                         f"{s['gen_tokens']['mean'] / 1e3:.0f}k | "
                         f"{s['zero_groups']['mean'] if 'zero_groups' in s else float('nan'):.2f} | "
                         f"{'' if name == 'grpo' or base is None else verdict(s, base)} |")
    return "\n".join(lines).replace("| nan |", "| - |")


def draw(result: dict, png: str) -> None:
    """Left to right, one panel per task: each run's final gold (mean, bars min-max over the
    seeds) with plain GRPO's range shaded; last panel: the share of no-signal groups per
    iteration of plain GRPO and of dynamic sampling on sort (seed 0)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(TASKS) + 1, figsize=(17, 4.5))
    summary = result["summary"]
    for ax, task in zip(axes, TASKS):
        names = [n for n in RUNS if f"{task}/{n}" in summary]
        base = summary.get(f"{task}/grpo")
        if base:
            ax.axhspan(base["gold"]["min"], base["gold"]["max"], color="0.85")
        for i, n in enumerate(names):
            g = summary[f"{task}/{n}"]["gold"]
            ax.errorbar(i, g["mean"], yerr=[[g["mean"] - g["min"]], [g["max"] - g["mean"]]],
                        fmt="o", capsize=3, color=f"C{i}")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(f"{task}: gold at the end" + ("" if task == "sort" else
                                                   f" ({REVIEWS_ITERS} iterations)"), fontsize=10)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    for n in ("grpo", "dynamic"):
        run = result["runs"].get(f"sort/{n}/0")
        if run and run.get("zero_groups_curve"):
            steps, share = zip(*run["zero_groups_curve"])
            ax.plot(steps, share, label=n, lw=1)
    ax.set_xlabel("iteration")
    ax.set_title("sort, seed 0: share of groups with no signal", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"),
                    help="where bench/details.py keeps each seed's SFT and RM")
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has")
    ap.add_argument("--draw_only", action="store_true", help="only summarise and draw")
    ap.add_argument("--table", action="store_true", help="print docs/methods.md's table")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.load(RESULTS)
    result.setdefault("mismatch", {})
    if not args.draw_only:
        for seed in args.seeds:
            root = os.path.join(args.work, f"seed{seed}")
            needs = (["sort_baseline"] if "sort" in args.tasks else []) + \
                    (["baseline"] if set(args.tasks) - {"sort"} else [])
            details.stages(seed, root, needs)
            if "reviews_rm" in args.tasks and str(seed) not in result["mismatch"]:
                result["mismatch"][str(seed)] = bf16_mismatch(os.path.join(root, "sft"), seed)
                results_file.save(RESULTS, result)
            for task in args.tasks:
                for name in args.runs:
                    key = f"{task}/{name}/{seed}"
                    if key in result["runs"] and not args.rerun:
                        continue
                    result["runs"][key] = run(seed, root, task, name)
                    summarise(result)
                    results_file.save(RESULTS, result)
    summarise(result)
    results_file.save(RESULTS, result)
    try:
        draw(result, os.path.join(ROOT, "bench", "results", "refinements.png"))
    except ImportError:
        print("matplotlib is not installed: no picture")
    if args.table:
        print(markdown_table(result))
        return
    for key, s in result["summary"].items():
        print(f"{key:26s} " + ", ".join(f"{k} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]"
                                        for k, v in s.items() if isinstance(v, dict)))


if __name__ == "__main__":
    main()
