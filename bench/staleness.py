"""Stale samples measured: a sampler 0 to 8 updates behind the learner, every off-policy
correction, PPO, GRPO and online DPO, on the reviews task (reward model; gold measured) and
on the sort task (the task's check), 3 seeds.

    python bench/staleness.py                                   # the whole grid (many hours)
    python bench/staleness.py --seeds 0 --tasks sort --algos grpo --lags 0 4 --threads 1
    python bench/staleness.py --table                           # the table, from the JSON

Every run is train_ppo.py with its defaults and `--sampler_lag N --offpolicy C` (lab/offpolicy.py
explains each correction). Lag 0 is run once per algorithm (in float32 the sampler is the
learner and every correction is the same); online DPO's loss takes no ratio, so it has one
row per lag ("none"); GSPO's sequence ratio is for GRPO only. The caps are the defaults:
--tis_cap 0 gives decoupled no cap, tis and mask their cap of 2. Reviews: from the SFT policy
and reward model of bench/details.py for the seed (the same --work folder, trained here if
missing), 100 iterations (half the default, so that the grid fits; stated in the table), the
final eval's gold, rm_score and kl on the 200 held-out prompts. Sort: from its SFT policy,
the default 200 iterations, the final eval's gold (the share sorted right) and gold_unseen.
Along each run: the eval curve (summarised as gold_along, the mean gold of its evals after the
start, and gold_low, the lowest: a run can fall and recover by its end), the training means of
mismatch_kl (the gap between sampler and learner), clipfrac, is_cut (the share of tokens
whose weight the cap cut or the mask dropped), approx_kl and minibatch_steps, and from the
final line the updates the approx-KL early stop cut short (early_stops) and those that took no
optimizer step at all (idle_updates).

What an asynchronous sampler would save is a model, not a measurement: from the lag-0 run's
own seconds per iteration of sampling (t_generate) and of the rest (scoring and learning),
a sampler running beside the learner overlaps the two, so an iteration costs max(sample,
rest) instead of their sum (any lag >= 1 allows the overlap; a longer queue only absorbs
uneven iterations). The summary writes it down per task and algorithm, labelled as a model.

Every run is written to --results (bench/results/staleness.json) as soon as it ends and is
not run again (--rerun to redo): a killed bench continues where it stopped and the study may
span several sittings; --results elsewhere plus --merge lets two processes share the grid.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import overoptimization as overopt  # noqa: E402
import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.lab.offpolicy import OFFPOLICY  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "staleness.json")
LAGS = (0, 1, 2, 4, 8)
ALGOS = ("ppo", "grpo", "online_dpo")
TASKS = {  # name: (train_ppo options, the final eval's figures kept)
    "reviews_rm": (dict(task="reviews", reward="rm", max_iters=100), ("gold", "rm_score", "kl")),
    "sort": (dict(task="sort", reward="task"), ("gold", "gold_unseen", "kl")),
}
TRAINED = ("mismatch_kl", "clipfrac", "is_cut", "approx_kl", "minibatch_steps", "t_generate",
           "t_score", "t_learn")
UPDATES = ("early_stops", "idle_updates")  # from the final line: updates cut short, or not taken


def corrections(algo: str, lag: int) -> list[str]:
    """The corrections run for `algo` at `lag` (module docstring)."""
    if lag == 0 or algo == "online_dpo":
        return ["none"]
    return [c for c in OFFPOLICY if c != "gspo" or algo == "grpo"]


def stages(seed: int, root: str, tasks: list[str]) -> None:
    """What the runs of `seed` start from, each trained unless already finished, in the folders
    bench/details.py uses: the reviews SFT policy and reward model, the sort task's SFT."""
    if "reviews_rm" in tasks:
        results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "sft"), seed=seed)
        results_file.train_stage(train_rm.main, train_rm.Config, os.path.join(root, "rm"),
                                 seed=seed, sft_dir=os.path.join(root, "sft"))
    if "sort" in tasks:
        results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "sort_sft"),
                                 task="sort", seed=seed)


def run(seed: int, root: str, task: str, algo: str, lag: int, correction: str) -> dict:
    options, kept = TASKS[task]
    sft = os.path.join(root, "sort_sft" if task == "sort" else "sft")
    out = os.path.join(root, "staleness", f"{task}_{algo}_lag{lag}_{correction}")
    start = time.time()
    # online DPO reads no --offpolicy (its loss has no ratio): its "none" is the default's
    offpolicy = "auto" if lag == 0 or algo == "online_dpo" else correction
    train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft, rm_dir=os.path.join(root, "rm"),
                                    seed=seed, algo=algo, sampler_lag=lag, offpolicy=offpolicy,
                                    **options))
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    figures = {k: rows[-1][k] for k in (*kept, *UPDATES) if k in rows[-1]}
    figures["seconds"] = round(time.time() - start, 1)
    train = [r for r in rows if "minibatch_steps" in r]
    for k in TRAINED:
        v = [r[k] for r in train if k in r]
        if v:
            figures[k] = sum(v) / len(v)
    figures["curve"] = [{k: r[k] for k in ("step", *kept) if k in r}
                        for r in rows if r.get("split") == "eval"]
    return figures


def along_the_run(run: dict) -> None:
    """Two figures of the eval curve beside the final gold (which hides a run that fell and
    recovered): gold_along, the mean gold of the evals after the first (the start, the same
    for every run), and gold_low, the lowest of them."""
    gold = [p["gold"] for p in run.get("curve", [])[1:] if "gold" in p]
    if gold:
        run["gold_along"] = sum(gold) / len(gold)
        run["gold_low"] = min(gold)


def summarise(result: dict) -> None:
    runs = result["runs"]
    for key, run in runs.items():
        along_the_run(run)
        # the change from the same seed's lag-0 run: the seeds differ more than the lags do
        task, algo, _, _, seed = key.split("/")
        start = runs.get(f"{task}/{algo}/lag0/none/{seed}")
        if start and "gold" in run:
            run["gold_change"] = run["gold"] - start["gold"]
    result["summary"] = results_file.over_seeds(
        result["runs"], ("gold", "gold_change", "gold_along", "gold_low", "gold_unseen", "rm_score", "kl",
                         "mismatch_kl", "clipfrac", "is_cut", "seconds"))
    by = {}
    for key, r in result["runs"].items():
        by.setdefault(key.rsplit("/", 1)[0], []).append(r)
    # the overlap model, from the lag-0 runs' seconds per iteration
    model = {}
    for key, runs in by.items():
        task, algo, lag, _ = key.split("/")
        if lag != "lag0":
            continue
        sample = sum(r["t_generate"] for r in runs) / len(runs)
        rest = sum(r["t_score"] + r["t_learn"] for r in runs) / len(runs)
        model[f"{task}/{algo}"] = {"sample_s": sample, "rest_s": rest,
                                   "synchronous_s": sample + rest, "overlapped_s": max(sample, rest),
                                   "saved": 1 - max(sample, rest) / (sample + rest)}
    result["async_model"] = {"what": "seconds per iteration (lag-0 runs, this machine) of "
                                     "sampling and of scoring + learning; an asynchronous "
                                     "sampler overlaps them: a model, not a measurement",
                             "rows": model}


def markdown_table(result: dict) -> str:
    lines = ["| task | algo | lag | correction | seeds | gold | gold along | lowest gold | KL | "
             "mismatch KL | clipfrac | cut |", "| --- " * 12 + "|"]

    def cell(s, k, digits=3):
        if k not in s:
            return ""
        v = s[k]
        return f"{v['mean']:.{digits}f} [{v['min']:.{digits}f}, {v['max']:.{digits}f}]"
    for key, s in sorted(result["summary"].items(), key=lambda kv: (
            kv[0].split("/")[0], kv[0].split("/")[1], int(kv[0].split("/")[2][3:]), kv[0])):
        task, algo, lag, correction = key.split("/")
        lines.append(f"| {task} | {algo} | {lag[3:]} | {correction} | {s['seeds']} | "
                     f"{cell(s, 'gold')} | {cell(s, 'gold_along')} | {cell(s, 'gold_low')} | "
                     f"{cell(s, 'kl', 2)} | {cell(s, 'mismatch_kl', 4)} | "
                     f"{cell(s, 'clipfrac')} | {cell(s, 'is_cut')} |")
    return "\n".join(lines)


def draw(result: dict, png: str) -> None:
    """Top row: the final gold against the lag, one panel per task and algorithm, one line per
    correction (mean of the seeds, bars from the lowest to the highest seed; every line starts
    at the lag-0 run). Bottom row: the gold along the run at the largest lag measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    summary = result["summary"]
    panels = sorted({tuple(k.split("/")[:2]) for k in summary})
    if not panels:
        return
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 7), squeeze=False)
    for col, (task, algo) in enumerate(panels):
        keys = [k.split("/") for k in summary if k.startswith(f"{task}/{algo}/")]
        lags = sorted({int(k[2][3:]) for k in keys})
        top, bottom = axes[0][col], axes[1][col]
        start = summary.get(f"{task}/{algo}/lag0/none")
        for i, correction in enumerate(OFFPOLICY):
            points = [(lag, summary[f"{task}/{algo}/lag{lag}/{correction}"]["gold"]) for lag in lags
                      if lag and f"{task}/{algo}/lag{lag}/{correction}" in summary]
            if not points:
                continue
            if start:
                points.insert(0, (0, start["gold"]))
            x = [lag for lag, _ in points]
            mean = [g["mean"] for _, g in points]
            bars = [[g["mean"] - g["min"] for _, g in points], [g["max"] - g["mean"] for _, g in points]]
            top.errorbar([v + 0.06 * (i - 2) for v in x], mean, yerr=bars, fmt="o-", ms=3,
                         capsize=2, color=f"C{i}", label=correction)
            last = max(x)
            curves = [r["curve"] for r in overopt.runs_of(result, f"{task}/{algo}/lag{last}/{correction}")]
            if curves and last:
                bottom.plot(overopt.mean_curve(curves, "step"), overopt.mean_curve(curves, "gold"),
                            color=f"C{i}", label=f"{correction}, lag {last}")
        curves = [r["curve"] for r in overopt.runs_of(result, f"{task}/{algo}/lag0/none")]
        if curves:
            bottom.plot(overopt.mean_curve(curves, "step"), overopt.mean_curve(curves, "gold"), "k--",
                        label="lag 0")
        top.set_title(f"{task}, {algo}: final gold", fontsize=10)
        top.set_xlabel("sampler lag (updates)")
        bottom.set_title(f"{task}, {algo}: gold along the run", fontsize=10)
        bottom.set_xlabel("iteration")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def lag_table(result: dict, task: str, figure: str = "gold") -> str:
    """`figure` (the final gold, or gold_change: its change from the same seed's lag-0 run) of
    `task` with the lags as columns: one row per algorithm and correction, mean [lowest,
    highest seed], and how many seeds have it; every row's lag 0 is the lag-0 run."""
    summary = result["summary"]
    keys = [k.split("/") for k in summary if k.startswith(f"{task}/")]
    lags = sorted({int(k[2][3:]) for k in keys})
    sign = "+" if figure == "gold_change" else ""
    lines = ["| algo | correction | " + " | ".join(f"lag {lag}" for lag in lags) + " |",
             "| --- " * (2 + len(lags)) + "|"]
    for algo in ALGOS:
        for correction in OFFPOLICY:
            row = [summary.get(f"{task}/{algo}/lag{lag}/{'none' if lag == 0 else correction}")
                   for lag in lags]
            if not any(row[i] for i, lag in enumerate(lags) if lag):
                continue
            cells = [f"{v['mean']:{sign}.3f} [{v['min']:{sign}.2f}, {v['max']:{sign}.2f}] ({v['n']})"
                     if v else "" for v in (s and s.get(figure) for s in row)]
            lines.append(f"| {algo} | {correction} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    ap.add_argument("--lags", type=int, nargs="+", default=list(LAGS))
    ap.add_argument("--corrections", nargs="+", default=list(OFFPOLICY), choices=list(OFFPOLICY),
                    help="run only these (each algorithm still skips what it cannot take)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"),
                    help="where bench/details.py keeps each seed's SFT and RM")
    ap.add_argument("--results", default=RESULTS, help="the JSON file the runs go to")
    ap.add_argument("--merge", nargs="+", default=[],
                    help="add the runs of these JSON files (another process's) to --results")
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has")
    ap.add_argument("--table", action="store_true", help="only print the table of the JSON")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.merge(args.results, args.merge) if args.merge else results_file.load(args.results)
    if not args.table and not args.merge:
        for seed in args.seeds:  # seeds outermost: a partial bench covers the whole grid
            root = os.path.join(args.work, f"seed{seed}")
            stages(seed, root, args.tasks)
            for task in args.tasks:
                for algo in args.algos:
                    for lag in args.lags:
                        for correction in corrections(algo, lag):
                            if correction not in args.corrections and lag:
                                continue
                            key = f"{task}/{algo}/lag{lag}/{correction}/{seed}"
                            if key in result["runs"] and not args.rerun:
                                continue
                            result["runs"][key] = run(seed, root, task, algo, lag, correction)
                            summarise(result)
                            results_file.save(args.results, result)
    summarise(result)
    if args.merge:
        results_file.save(args.results, result)
    if not args.table:
        try:
            draw(result, os.path.splitext(args.results)[0] + ".png")
        except ImportError:
            print("matplotlib is not installed: no picture")
    print(markdown_table(result))
    for task in sorted({k.split("/")[0] for k in result["summary"]}):
        print(f"\n{task}: the final gold by lag\n")
        print(lag_table(result, task))
        print(f"\n{task}: its change from the same seed's lag 0\n")
        print(lag_table(result, task, "gold_change"))


if __name__ == "__main__":
    main()
