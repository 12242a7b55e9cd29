"""What each implementation detail of PPO is worth: the default run with one detail taken out,
judged by the gold reward, 3 seeds.

    python bench/details.py                         # every detail, seeds 0 1 2 (~75 min a seed
                                                    # on 2 CPU cores)
    python bench/details.py --seeds 0 --details no_whiten no_kl
    python bench/details.py --draw_only --table     # docs/details.md's table, from the JSON

For each seed: SFT and the reward model with the scripts' defaults and that --seed (and a
second reward model without its normalisation, for `rm_unnormalised`), then the default PPO
run (`baseline`) and one run per detail below, each the default run with that one thing
changed. Figures per run, from its final eval on the 200 held-out prompts: gold, rm_score,
well_formed, KL to the SFT policy, distinct2 (collapse into repetition shows here); and the
run's wall seconds and skipped updates. Every run is written to bench/results/details.json
as soon as it ends and is not run again (--rerun to redo): a killed bench continues where it
stopped, and a bench may span several sittings.

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
from mingpt_rlhf import ppo_trainer  # noqa: E402
from mingpt_rlhf.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "details.json")
# --results: another file, for a second process running other seeds at the same time; --merge
# adds such files' runs to RESULTS


@contextlib.contextmanager
def no_whitening():
    """Advantages used as GAE gives them (ppo_trainer calls ppo.masked_whiten)."""
    real = ppo_trainer.masked_whiten
    ppo_trainer.masked_whiten = lambda x, mask, *a, **k: x * mask
    try:
        yield
    finally:
        ppo_trainer.masked_whiten = real


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




def merge(paths: list[str]) -> None:
    """Add the runs of other results files (seeds run by another process) to RESULTS."""
    result = results_file.load(RESULTS)
    for path in paths:
        result["runs"].update(results_file.load(path)["runs"])
    summarise(result)
    results_file.save(RESULTS, result)


def stages(seed: int, root: str) -> None:
    """SFT, RM and the unnormalised RM of `seed` in root (each only if missing)."""
    if not os.path.exists(os.path.join(root, "sft", "ckpt.pt")):
        train_sft.main(train_sft.Config(out_dir=os.path.join(root, "sft"), seed=seed))
    for name, extra in (("rm", {}), ("rm_unnormalised", dict(norm_samples=0))):
        if not os.path.exists(os.path.join(root, name, "ckpt.pt")):
            train_rm.main(train_rm.Config(out_dir=os.path.join(root, name), seed=seed,
                                          sft_dir=os.path.join(root, "sft"), **extra))


def run(seed: int, root: str, name: str) -> dict:
    _, options, patch = DETAILS[name]
    options = dict(options)
    rm = os.path.join(root, "rm_unnormalised" if options.pop("rm", "") else "rm")
    out = os.path.join(root, name)
    start = time.time()
    with (patch() if patch else contextlib.nullcontext()):
        train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=os.path.join(root, "sft"),
                                        rm_dir=rm, seed=seed, **options))
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
        s = {"seeds": len(runs), "what": DETAILS[name][0] if name in DETAILS else ""}
        for k in ("gold", "rm_score", "kl", "distinct2", "seconds"):
            v = [r[k] for r in runs if k in r]
            if v:
                s[k] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
        result["summary"][name] = s


def markdown_table(result: dict) -> str:
    """The table of docs/details.md: per detail, gold, RM score, KL and distinct2 as the mean
    over the seeds run so far [their range], and the gold's change from the baseline."""
    summary = result["summary"]
    base = summary.get("baseline", {}).get("gold", {}).get("mean")
    lines = ["| run | what changes | seeds | gold | change | RM score | KL | distinct2 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(s, k, digits=3):
        if k not in s:
            return ""
        v = s[k]
        if s["seeds"] == 1:
            return f"{v['mean']:.{digits}f}"
        return f"{v['mean']:.{digits}f} [{v['min']:.{digits}f}, {v['max']:.{digits}f}]"
    for name in DETAILS:
        if name not in summary:
            continue
        s = summary[name]
        change = "" if base is None or name == "baseline" else f"{s['gold']['mean'] - base:+.3f}"
        lines.append(f"| `{name}` | {DETAILS[name][0]} | {s['seeds']} | {cell(s, 'gold')} | "
                     f"{change} | {cell(s, 'rm_score', 2)} | {cell(s, 'kl', 2)} | "
                     f"{cell(s, 'distinct2')} |")
    return "\n".join(lines)


def main():
    global RESULTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--details", nargs="+", default=list(DETAILS), choices=list(DETAILS))
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"))
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--draw_only", action="store_true", help="only summarise the JSON")
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
            stages(seed, root)
            for name in args.details:
                key = f"{name}/{seed}"
                if key in result["runs"] and not args.rerun:
                    continue
                result["runs"][key] = run(seed, root, name)
                summarise(result)
                results_file.save(RESULTS, result)
    summarise(result)
    results_file.save(RESULTS, result)
    if args.table:
        print(markdown_table(result))
        return
    for name, s in result["summary"].items():
        print(f"{name:18s} " + ", ".join(f"{k} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]"
                                         for k, v in s.items() if isinstance(v, dict)))


if __name__ == "__main__":
    main()
