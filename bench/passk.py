"""pass@k of the sort task's SFT policy and of GRPO trained from it: does RL only sharpen?

    python bench/passk.py                              # seeds 0 1 2, n = 1024, 200 problems
    python bench/passk.py --seeds 0 --n 256            # a quicker look
    python bench/passk.py --table                      # the table from the JSON
    python bench/passk.py --draw                       # its picture, bench/results/passk.png
    python bench/passk.py --policies grpo_kl_cov       # one more policy, 3 seeds
    python bench/passk.py --policies grpo_clip_cov grpo_kl_cov grpo_entropy   # the entropy row

For each seed: SFT on the sort task's teacher (`train_sft.py --task sort --seed S`), then each
RL policy of RL below from it on the exact-match check (`train_ppo.py --task sort --reward task
--algo grpo --seed S`, PPO, GRPO learning only from negative advantages, GRPO with Clip-Cov or
KL-Cov; every other option at its default); then each policy answers each of the first --problems held-out
problems --n times at temperature 1, and pass@k is estimated without bias from those draws
(mingpt_rlhf/lab/passk.py) for k = 1, 2, 4, ..., up to --n, over all the problems and over
the never-seen ones (held-out problems whose digits no training problem holds: their answers
were never shown). Beside the counts, each RL policy's training ends in `trained`: the final
held-out accuracy and KL its run logged and its mean token entropy over the last 20
iterations, which set Clip-Cov, KL-Cov and an entropy bonus against the default. Each
policy's counts are saved to bench/results/passk.json as they end (a killed bench goes on
where it stopped). Yue et al. (2025) report that RL raises pass@1 while
the model it started from solves more problems at large k: the curves would cross.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.lab.passk import pass_at_k_curve, right_answers  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "passk.json")
# the RL policies, each trained from the seed's SFT policy on the exact-match check with every
# other option at its default; "sft" is the policy they start from
RL = {"grpo": dict(algo="grpo"), "ppo": dict(algo="ppo"),
      "grpo_negative": dict(algo="grpo", learn_tokens="negative"),   # what to avoid, only
      "grpo_clip_cov": dict(algo="grpo", cov_loss="clip_cov"),
      "grpo_kl_cov": dict(algo="grpo", cov_loss="kl_cov"),
      "grpo_entropy": dict(algo="grpo", entropy_coef=0.01)}   # the usual way to keep entropy
TRAINED = ("gold", "gold_unseen", "kl", "entropy")


def counts_of(policy_dir: str, task, n: int, problems: int, seed: int) -> dict:
    """{"right": c per problem, "unseen": whether each problem's answer was never shown}."""
    model, tokenizer, _ = load_policy(policy_dir, flag="policy")
    prompts = task.prompts("eval")[:problems]
    generator = torch.Generator().manual_seed(seed)
    right = right_answers(model, tokenizer, task, prompts, n, max_new_tokens=16,
                          generator=generator)
    return {"right": right, "unseen": [task.unseen(p) for p in prompts]}


def trained(folder: str) -> dict:
    """What an RL run's own log says at its end: the final held-out accuracy (all problems, the
    unseen ones), the KL to the SFT policy, and the mean token entropy of its rollouts over the
    last 20 iterations."""
    rows = read_metrics(os.path.join(folder, "metrics.jsonl"))
    final = [r for r in rows if r.get("final")][-1]
    entropy = [r["entropy"] for r in rows if "entropy" in r and "split" not in r][-20:]
    return {"gold": final["gold"], "gold_unseen": final["gold_unseen"], "kl": final["kl"],
            "entropy": sum(entropy) / len(entropy)}


def curves(run: dict, n: int) -> dict:
    ks = [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    unseen = [(n, c) for c, u in zip(run["right"], run["unseen"]) if u]
    return {"all": pass_at_k_curve([(n, c) for c in run["right"]], ks),
            "unseen": pass_at_k_curve(unseen, ks) if unseen else {}}


def with_curves(result: dict) -> dict:
    """The result with each run's pass@k curves (all problems, the unseen ones) and, per
    policy, the min and max over the seeds at each k: what the docs quote."""
    result["curves"] = {key: curves(run, result["n"]) for key, run in result["runs"].items()}
    flat = {key: {f"{part}@{k}": v for part, curve in c.items() for k, v in curve.items()}
            for key, c in result["curves"].items()}
    for key, run in result["runs"].items():
        flat[key].update(run.get("trained", {}))
    result["spread"] = results_file.over_seeds(flat, sorted({f for r in flat.values() for f in r}))
    return result


def table(result: dict) -> None:
    n = result["n"]
    for key, run in sorted(result["runs"].items()):
        c = curves(run, n)
        print(f"{key:12s} " + " ".join(f"@{k} {v:.3f}" for k, v in c["all"].items())
              + f"   unseen ({sum(run['unseen'])}): "
              + " ".join(f"@{k} {v:.3f}" for k, v in c["unseen"].items()))
        if "trained" in run:
            print(" " * 13 + "trained: " + ", ".join(f"{f} {run['trained'][f]:.3f}" for f in TRAINED))


def draw(result: dict, path: str) -> None:
    """Two panels over k (log scale): pass@k of each policy, and the problems it still misses
    (problems x (1 - pass@k), log scale: where the curves near 1 cross). Each line is the mean
    over the seeds, the band their min-max."""
    try:
        import matplotlib
    except ImportError:
        print("error: --draw needs matplotlib (pip install matplotlib)", file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    spread, problems = result["spread"], result["problems"]
    ks = sorted({int(f.split("@")[1]) for row in spread.values() for f in row if f.startswith("all@")})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in sorted(spread, key=lambda p: (p != "sft", p)):
        rows = [spread[policy][f"all@{k}"] for k in ks]
        style = dict(color="black", linestyle="--") if policy == "sft" else {}
        for ax, f in ((axes[0], lambda v: v), (axes[1], lambda v: problems * (1 - v) + 0.1)):
            line, = ax.plot(ks, [f(r["mean"]) for r in rows], marker=".", label=policy, **style)
            ax.fill_between(ks, [f(r["min"]) for r in rows], [f(r["max"]) for r in rows],
                            color=line.get_color(), alpha=0.15)
    axes[0].set_ylabel("pass@k (held-out problems)")
    axes[1].set_ylabel(f"problems of {problems} not yet solved (+0.1, log)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (answers drawn per problem)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"sort: pass@k of the SFT policy and of RL from it, {result['n']} "
                 f"draws per problem, seeds' mean and range", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=1024, help="answers sampled per problem")
    ap.add_argument("--problems", type=int, default=200, help="held-out problems (the first ones)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_passk"))
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--policies", nargs="+", default=["sft", "grpo", "ppo", "grpo_negative"],
                    choices=["sft", *RL], help="which policies (sft: the one RL starts from)")
    ap.add_argument("--table", action="store_true", help="only print the table of the JSON "
                    "(and write its curves into it)")
    ap.add_argument("--draw", action="store_true", help="only draw the JSON's curves into "
                    "bench/results/passk.png (needs matplotlib)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = results_file.load(args.results)
    if args.draw:
        draw(with_curves(result), os.path.join(os.path.dirname(os.path.abspath(args.results)), "passk.png"))
        return
    if not args.table:
        if result.get("n", args.n) != args.n or result.get("problems", args.problems) != args.problems:
            sys.exit(f"{args.results} holds n={result['n']}, problems={result['problems']}: "
                     f"pass another --results for other sizes")
        result.update(n=args.n, problems=args.problems)
        for seed in args.seeds:
            task = get_task("sort", seed=seed)
            sft = os.path.join(args.work, f"seed{seed}", "sft")
            results_file.train_stage(train_sft.main, train_sft.Config, sft, task="sort", seed=seed)
            for name in args.policies:
                key = f"{name}/{seed}"
                folder = os.path.join(args.work, f"seed{seed}", name) if name != "sft" else sft
                if key in result["runs"]:
                    continue
                if name != "sft":
                    results_file.train_stage(train_ppo.main, train_ppo.Config, folder, sft_dir=sft,
                                             task="sort", reward="task", seed=seed, **RL[name])
                result["runs"][key] = counts_of(folder, task, args.n, args.problems, seed)
                result["runs"][key]["measured"] = results_file.measured(ROOT)
                if name != "sft":
                    result["runs"][key]["trained"] = trained(folder)
                    result["runs"][key]["ran_with"] = results_file.ran_with(folder)
                results_file.save(args.results, with_curves(result))
    else:
        results_file.save(args.results, with_curves(result))
    table(result)


if __name__ == "__main__":
    main()
