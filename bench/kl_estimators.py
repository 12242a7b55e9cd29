"""The six KL configurations measured: the estimator k1, k2 or k3 of KL(policy || SFT), in the
reward or in the loss, on the reviews task trained on the reward model and on the guessing
game, 3 seeds.

    python bench/kl_estimators.py                          # everything: 6 x 2 tasks x 3 seeds
                                                           # (about 45 minutes a seed on 2 CPU cores)
    python bench/kl_estimators.py --seeds 0 --tasks guess --threads 1
    python bench/kl_estimators.py --table                  # the table, from the JSON

What each configuration's gradient follows in expectation is exact in the gradient oracle
(docs/gradients.md): k1 in the reward follows KL's own gradient, k1 in the loss none, k2 in
the loss each token's own KL without the later tokens' share, k3 in the loss the forward KL,
k2 and k3 in the reward a semi-gradient that drives the tokens the policy made rarer than the
reference rarer still. This bench measures what that is worth with sampled batches, a
trained reward model and an adaptive beta, on the outcome that matters: the gold reward (the
task's true score) against the KL to the SFT policy on held-out prompts.

Every run is train_ppo.py with its defaults (GRPO as Dr. GRPO, `--algo`), `--kl_in` and
`--kl_estimator` set, and nothing else changed. Reviews: from the SFT policy and reward model
that bench/details.py trains for each seed in the same --work folder (trained here if
missing), --max_iters 200 (the default); figures from the final eval on the 200 held-out
prompts: gold, rm_score, kl. The guessing game: from an SFT policy on the teacher's episodes
(`train_sft.py --env guess`, trained here for each seed), 400 iterations as
bench/multiturn.py; figures from the final eval on held-out episodes: reward, success, turns,
kl. The logged kl is k1 summed over the response whatever estimator the run charges, so the
six are measured on one scale.

Every run is written to --results (bench/results/kl_estimators.json) as soon as it ends and is
not run again (--rerun to redo): a killed bench continues where it stopped, and a bench may
span several sittings. --max_iters N and --results elsewhere make a smoke run that leaves the
study's JSON alone.
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
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "kl_estimators.json")
CONFIGS = [f"{estimator}_in_{place}" for place in ("reward", "loss") for estimator in ("k1", "k2", "k3")]
TASKS = {  # name: (train_ppo options, iterations, the final eval's figures kept)
    "reviews_rm": (dict(task="reviews", reward="rm"), 200, ("gold", "rm_score", "kl", "well_formed")),
    "guess": (dict(env="guess", max_new_tokens=3), 400, ("reward", "success", "turns", "done_rate", "kl")),
}


def options_of(config: str) -> dict:
    estimator, _, place = config.split("_")
    return dict(kl_estimator=estimator, kl_in=place)


def stages(seed: int, root: str, tasks: list[str]) -> None:
    """What the runs of `seed` start from, each trained unless already finished: on reviews
    the SFT policy and reward model of bench/details.py (the same folders, shared)."""
    if "reviews_rm" in tasks:
        results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "sft"), seed=seed)
        results_file.train_stage(train_rm.main, train_rm.Config, os.path.join(root, "rm"),
                                 seed=seed, sft_dir=os.path.join(root, "sft"))
    if "guess" in tasks:
        results_file.train_stage(train_sft.main, train_sft.Config, os.path.join(root, "guess_sft"),
                                 env="guess", seed=seed, max_new_tokens=3)


def run(seed: int, root: str, task: str, config: str, algo: str, max_iters: int) -> dict:
    options, iters, kept = TASKS[task]
    sft = os.path.join(root, "guess_sft" if task == "guess" else "sft")
    out = os.path.join(root, "kl_estimators", f"{task}_{algo}_{config}")
    start = time.time()
    train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft, rm_dir=os.path.join(root, "rm"),
                                    seed=seed, algo=algo, max_iters=max_iters or iters,
                                    **options, **options_of(config)))
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    final = rows[-1]
    figures = {k: final[k] for k in kept if k in final}
    figures["seconds"] = round(time.time() - start, 1)
    figures["iterations"] = max_iters or iters
    figures["curve"] = [{k: r[k] for k in ("step", *kept) if k in r}
                        for r in rows if r.get("split") == "eval"]
    return figures


def summarise(result: dict) -> None:
    result["summary"] = results_file.over_seeds(
        result["runs"], ("gold", "rm_score", "reward", "success", "turns", "kl", "seconds"))


def markdown_table(result: dict) -> str:
    """Per task and configuration: the task's score (gold on reviews, success on the game),
    KL to the SFT policy, as the mean over the seeds [their range]."""
    lines = ["| task | algo | configuration | seeds | score | KL | seconds |", "| --- " * 7 + "|"]
    for key, s in sorted(result["summary"].items()):
        task, algo, config = key.split("/")
        score = "gold" if task == "reviews_rm" else "success"

        def cell(k, digits=3):
            if k not in s:
                return ""
            v = s[k]
            return f"{v['mean']:.{digits}f} [{v['min']:.{digits}f}, {v['max']:.{digits}f}]"
        lines.append(f"| {task} | {algo} | {config.replace('_', ' ')} | {s['seeds']} | "
                     f"{score} {cell(score)} | {cell('kl', 2)} | {s['seconds']['mean']:.0f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    ap.add_argument("--algo", default="grpo", choices=["grpo", "rloo", "ppo", "reinforce++"],
                    help="the algorithm every run uses (each takes all six configurations)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"),
                    help="where bench/details.py keeps each seed's SFT and RM")
    ap.add_argument("--results", default=RESULTS, help="the JSON file the runs go to")
    ap.add_argument("--max_iters", type=int, default=0,
                    help="iterations of every run (0 = the task's: 200 on reviews, 400 on guess)")
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has")
    ap.add_argument("--table", action="store_true", help="only print the table of the JSON")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.load(args.results)
    if not args.table:
        for seed in args.seeds:  # seeds outermost: a partial bench covers every configuration
            root = os.path.join(args.work, f"seed{seed}")
            stages(seed, root, args.tasks)
            for task in args.tasks:
                for config in args.configs:
                    key = f"{task}/{args.algo}/{config}/{seed}"
                    if key in result["runs"] and not args.rerun:
                        continue
                    result["runs"][key] = run(seed, root, task, config, args.algo, args.max_iters)
                    summarise(result)
                    results_file.save(args.results, result)
    summarise(result)
    print(markdown_table(result))


if __name__ == "__main__":
    main()
