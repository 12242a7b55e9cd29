"""The built-in pipeline with default options, timed, and the comparisons docs/results.md quotes.

    python bench/pipeline.py                 # ~20 min on a 2-core CPU
    python bench/pipeline.py --skip_train    # only re-measure the comparison from existing runs

1. train_sft.py, train_rm.py, train_ppo.py with their defaults (out dirs under --root),
   wall-clock seconds of each and their final figures.
2. Ablations of train_ppo.py on the same SFT and RM: --kl_coef 0 --adaptive_kl false (what
   the KL penalty is for), --ptx_coef 0 and --ptx_coef 0.1 (what the ptx loss does).
3. Best-of-n (n = 1, 4, 16) from the SFT policy next to the PPO policies, with the same
   reward model, on PPO's 200 held-out eval prompts sampled 16 times each: gold (with its
   standard error), RM score, well_formed, off_taste (well-formed responses that still use a
   negative or neutral adjective), distinct2, generated tokens per prompt, and each policy's LM loss on
   the held-out demonstrations (demo_loss).
4. Per PPO run, its logged per-iteration figures (KL, beta, clipfrac, approx-KL, explained
   variance, entropy, minibatch steps, EOS rate, RM score, gold): 10th / 50th / 90th
   percentiles over the first 20 and the last 100 iterations, and the mean of the last 20
   (docs/details.md's healthy run, docs/results.md's KL-penalty paragraph).
Writes bench/results/pipeline.json (with the revision it measured) and prints it, and draws two pictures from the runs'
metrics (matplotlib): pipeline_ppo.png (the default PPO run: RM score and gold reward of each
iteration's rollouts, and the KL against its target) and pipeline_kl0.png (the same beside
`--kl_coef 0`: its RM score keeps rising while the gold reward falls). `--draw_only` redraws them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.methods.bestofn import best_of_n  # noqa: E402
from results_file import measured  # noqa: E402
from mingpt_rlhf.stages import load_policy, load_reward_model  # noqa: E402,F401 (the benches share it)
from mingpt_rlhf.data import SFTData  # noqa: E402
from mingpt_rlhf.evaluate import distinct_n  # noqa: E402
from mingpt_rlhf.tasks import ADJECTIVES, get_task  # noqa: E402


# train_ppo.py with its defaults ("ppo"), and the ablations docs/results.md quotes
PPO_RUNS = {
    "ppo": {},
    "ppo_kl0": {"kl_coef": 0.0, "adaptive_kl": False},  # what the KL penalty is for
    "ppo_ptx0": {"ptx_coef": 0.0},                     # what the ptx loss is for
    "ppo_ptx0.1": {"ptx_coef": 0.1},                   # a stronger ptx loss
    "ppo_fixed_beta": {"adaptive_kl": False},          # beta 0.05 throughout, as before the
}                                                      # adaptive controller could move it


def off_taste(task, prompts, texts) -> float:
    """Share of the well-formed responses that still use a negative or neutral adjective."""
    kept = [t for p, t in zip(prompts, texts) if task.well_formed(p, t)]
    return sum(any(ADJECTIVES.get(w, 1) < 1 for w in t.split()) for t in kept) / max(1, len(kept))


def comparison_prompts(task, samples_per_prompt):
    """PPO's held-out eval prompts, each `samples_per_prompt` times (16: 3,200 responses; a
    200-sample gold mean has a standard error of ~0.015, too coarse to rank policies 0.02 apart)."""
    return task.prompts("eval")[:train_ppo.Config().eval_prompts] * samples_per_prompt


def held_out_figures(run_dir, rm, task, prompts, n, seed, demos, demo_loss=None) -> dict:
    """Best-of-`n` responses of the policy in `run_dir` to `prompts` (n = 1: the policy's own
    samples), scored like PPO scores: gold and its standard error, RM score, well_formed,
    off_taste, distinct2, generated tokens per prompt, and the LM loss on the held-out
    demonstrations (cached per run_dir in `demo_loss`)."""
    demo_loss = {} if demo_loss is None else demo_loss
    policy, tokenizer, _ = load_policy(run_dir)
    if run_dir not in demo_loss:  # how much of the SFT distribution the policy kept
        data = SFTData(tokenizer, demos, policy.config.block_size)
        demo_loss[run_dir] = round(train_sft.eval_loss(policy, data, 250, "cpu",
                                                       contextlib.nullcontext()), 4)
        policy.eval()
    texts, scores, tokens = best_of_n(policy, rm, tokenizer, prompts, n, train_ppo.Config().max_new_tokens,
                                      generator=torch.Generator().manual_seed(seed))
    golds = torch.tensor([task.gold_reward(p, t) for p, t in zip(prompts, texts)])
    return {
        "gold": round(golds.mean().item(), 4),
        "gold_stderr": round(golds.std().item() / len(golds) ** 0.5, 4),
        "rm_score": round(scores.mean().item(), 4),
        "well_formed": round(sum(task.well_formed(p, t) for p, t in zip(prompts, texts)) / len(prompts), 4),
        "off_taste": round(off_taste(task, prompts, texts), 4),
        "distinct2": round(distinct_n(texts, 2), 4),
        "tokens_per_prompt": round(tokens, 1),
        "demo_loss": demo_loss[run_dir]}


def read_metrics(run_dir):
    """(training rows, eval rows) of a run's metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return ([r for r in rows if "split" not in r and "final" not in r],
            [r for r in rows if r.get("split") == "eval"])


# the per-iteration figures docs/details.md's "healthy run" table reads, per PPO run
HEALTHY = ("kl", "kl_coef", "clipfrac", "approx_kl", "explained_var", "entropy",
           "minibatch_steps", "eos_rate", "rm_score", "gold")


def percentiles(values: list[float]) -> dict:
    """The 10th, 50th and 90th percentiles (nearest rank)."""
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return {"p10": round(pick(0.1), 4), "p50": round(pick(0.5), 4), "p90": round(pick(0.9), 4)}


def iteration_figures(run_dir: str) -> dict:
    """Per figure of HEALTHY: its percentiles over the first 20 and the last 100 logged
    iterations, and its mean over the last 20 (what a run's curves end at)."""
    train, _ = read_metrics(run_dir)
    out = {}
    for key in HEALTHY:
        values = [r[key] for r in train if key in r]
        if values:
            out[key] = {"first20": percentiles(values[:20]), "last100": percentiles(values[-100:]),
                        "last20_mean": round(sum(values[-20:]) / len(values[-20:]), 4)}
    return out


def smooth(values, window=10):
    """Trailing mean over `window` values (fewer at the start)."""
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1))
            for i in range(len(values))]


def draw_runs(runs, path, kl_target):
    """Two panels for the RL runs [(label, run_dir)]: RM score (solid) and gold (dashed) of each
    iteration's rollouts, eval gold as dots; and the KL to the SFT policy with its target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_kl) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (label, run_dir) in enumerate(runs):
        train, evals = read_metrics(run_dir)
        color = f"C{i}"
        steps = [r["step"] for r in train]
        for key, style, name in (("rm_score", "-", "RM score"), ("gold", "--", "gold")):
            values = [r[key] for r in train]
            ax.plot(steps, values, color=color, lw=0.6, ls=style, alpha=0.3)  # each iteration
            ax.plot(steps, smooth(values), color=color, lw=1.6, ls=style,
                    label=f"{label}: {name} (mean of 10 iterations)")
        ax.plot([r["step"] for r in evals], [r["gold"] for r in evals], "o", color=color, ms=4,
                label=f"{label}: gold, held-out eval")
        ax_kl.plot(steps, [r["kl"] for r in train], color=color, lw=1.2, label=label)
    ax_kl.axhline(kl_target, color="gray", ls=":", label=f"KL target ({kl_target:g})")
    ax.set(xlabel="PPO iteration", ylabel="reward per response", title="reward model score and gold reward")
    ax_kl.set(xlabel="PPO iteration", ylabel="nats per response", title="KL to the SFT policy")
    if max(r["kl"] for _, d in runs for r in read_metrics(d)[0]) > 30:
        ax_kl.set_yscale("log")
    for a in (ax, ax_kl):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"picture: {path}")


def draw_pictures(root):
    """bench/results/pipeline_ppo.png and pipeline_kl0.png from the runs in `root`."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('no pictures: pip install -e ".[plot]" for matplotlib')
        return
    results = os.path.join(ROOT, "bench", "results")
    target = train_ppo.Config().kl_target
    if os.path.exists(os.path.join(root, "ppo", "metrics.jsonl")):
        draw_runs([("default", os.path.join(root, "ppo"))], os.path.join(results, "pipeline_ppo.png"), target)
        if os.path.exists(os.path.join(root, "ppo_kl0", "metrics.jsonl")):
            draw_runs([("default", os.path.join(root, "ppo")), ("--kl_coef 0", os.path.join(root, "ppo_kl0"))],
                      os.path.join(results, "pipeline_kl0.png"), target)


def timed(fn, cfg):
    t = time.time()
    summary = fn(cfg)
    return round(time.time() - t, 1), summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="out/bench", help="folder for the runs")
    ap.add_argument("--skip_train", action="store_true", help="reuse the runs in --root")
    ap.add_argument("--runs", nargs="+", default=list(PPO_RUNS), choices=list(PPO_RUNS),
                    help="which PPO runs to train (default: all); the others are compared if "
                         "their folders exist")
    ap.add_argument("--reuse_sft_rm", action="store_true",
                    help="train only the --runs, from the SFT and RM already in --root")
    ap.add_argument("--draw_only", action="store_true",
                    help="only redraw the pictures from the runs in --root (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--samples_per_prompt", type=int, default=16,
                    help="responses per held-out prompt in the policy comparison")
    args = ap.parse_args()
    r = lambda name: os.path.join(args.root, name)
    if args.draw_only:
        return draw_pictures(args.root)
    results = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if not args.skip_train:
        results["seconds"] = {}
        if not args.reuse_sft_rm:
            s_sft, sft = timed(train_sft.main, train_sft.Config(out_dir=r("sft"), seed=args.seed))
            s_rm, rm = timed(train_rm.main, train_rm.Config(out_dir=r("rm"), sft_dir=r("sft"), seed=args.seed))
            results.update(seconds={"sft": s_sft, "rm": s_rm}, sft=sft, rm=rm)
        for name, options in ((n, PPO_RUNS[n]) for n in args.runs):
            seconds, summary = timed(train_ppo.main, train_ppo.Config(
                out_dir=r(name), sft_dir=r("sft"), rm_dir=r("rm"), seed=args.seed, **options))
            results["seconds"][name] = seconds
            results[name] = summary
        if not args.reuse_sft_rm and "ppo" in args.runs:
            results["seconds"]["pipeline"] = s_sft + s_rm + results["seconds"]["ppo"]

    # Best-of-n from the SFT policy next to the PPO policies, all on PPO's held-out eval prompts,
    # each prompt sampled --samples_per_prompt times, scored like PPO scores.
    rm = load_reward_model(r("rm"))
    task = get_task("reviews", seed=args.seed)
    prompts = comparison_prompts(task, args.samples_per_prompt)
    runs = [("sft_best_of_1", "sft", 1), ("sft_best_of_4", "sft", 4), ("sft_best_of_16", "sft", 16)]
    runs += [(name, name, 1) for name in PPO_RUNS]
    demos = task.sft_examples("eval")
    demo_loss = {}  # per run: the policy's LM loss on the held-out demonstrations
    compared = {"prompts": len(prompts) // args.samples_per_prompt,
                "samples_per_prompt": args.samples_per_prompt}
    for name, run_dir, n in runs:
        if not os.path.exists(os.path.join(r(run_dir), "ckpt.pt")):
            continue
        compared[name] = held_out_figures(r(run_dir), rm, task, prompts, n, args.seed, demos, demo_loss)
        print(name, compared[name], flush=True)
    results["compared"] = compared
    results["iterations"] = {name: iteration_figures(r(name)) for name in PPO_RUNS
                             if os.path.exists(os.path.join(r(name), "metrics.jsonl"))}
    results["measured"] = measured(ROOT)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "pipeline.json")
    if (args.skip_train or len(args.runs) < len(PPO_RUNS)) and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # keep the earlier figures of what this invocation did not re-run, and say which are new
        for key in ("seconds", "compared", "iterations"):
            results[key] = {**old.get(key, {}), **results.get(key, {})}
        results = {**old, **results, "rerun": ([] if args.skip_train else
                                             [*([] if args.reuse_sft_rm else ["sft", "rm"]), *args.runs])}
        results.pop("best_of_n", None)  # the 200-sample table of earlier versions
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))
    draw_pictures(args.root)


if __name__ == "__main__":
    main()
