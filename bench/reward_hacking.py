"""Reward hacking measured against the gold reward: ensembles of reward models under label
noise, a labeller that likes length, and the early warning scored against the gold's peak.

    python bench/reward_hacking.py --seeds 0 1 2 --threads 1   # the full study (hours: see
                                                               # docs/reward_hacking.md)
    python bench/reward_hacking.py --smoke --work /tmp/rh --results /tmp/rh.json   # tiny sizes:
                                                               # the whole code path, minutes
    python bench/reward_hacking.py --table                     # the tables, from the JSON

Two processes can run two seeds at once (`--threads 1` each): one writes the default JSON,
the other `--results FILE`; then `--merge FILE` adds the second file's runs to the default one.

The grid, per seed (the SFT policy and its prompts are bench/details.py's, in --work/seed{seed}):
- reward models (train_rm.py): for each label noise in NOISE (`--label_noise`), an ensemble of
  MEMBERS reward models (`--ensemble`; member 0 is the single reward model) with its WARM
  average, and a held-out reward model trained on other pairs of the same labeller
  (`--data_seed seed + 1000`), whose gap to the training reward is a warning signal; the same
  two for the length-biased labeller (`--length_bias LENGTH_BIAS`, no noise); per ensemble
  ("rm"), each member's and WARM's held-out accuracy and how far apart the members' trunks
  and heads ended;
- best-of-n ("bon"): N_MAX samples per held-out prompt from the SFT policy, scored by each
  reward in RULES (single, the ensemble's mean, wco, uwo, and warm); gold and proxy of the
  response each picks for n = 1, 2, 4, ... N_MAX, against d = sqrt(log n - (n - 1) / n)
  (bench/overoptimization.py's sampling and curve);
- PPO ("ppo"): against each reward in RULES at each fixed KL coefficient in KL_COEFS (a value
  head on the actor, as bench/overoptimization.py), logging gold and proxy against d = sqrt(KL)
  at every eval and every iteration, and the reward-hacking signals and warning
  (mingpt_rlhf/lab/hacking.py; the held-out reward model above);
- length ("length"): PPO against the length-biased reward model at each KL coefficient: its
  gold gain, its length gain, the reward gain within length buckets (Singhal et al.'s test:
  how much of the gain remains between responses of one length), and PPO on a reward that
  counts only length (`length_reward` below), for its gold;
- the warning, scored over every PPO run: the iteration where the gold (a moving mean of
  SMOOTH iterations) peaked; a run "overoptimizes" when its gold ends more than DROP below
  that peak; per run, whether the warning fired, before the peak or not, and how many
  iterations ahead.

Every run is written to bench/results/reward_hacking.json as it ends and is not redone
(--rerun to redo); a killed training run resumes from its checkpoint. --smoke runs the same
code at tiny sizes (SMOKE) in its own --work folder: it checks the study runs, it measures
nothing.
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
import overoptimization as overopt  # noqa: E402
import results_file  # noqa: E402
from warning_score import (DROP, SMOOTH, calibrate, calibration_table, gold_peak,  # noqa: E402,F401
                           rule_figures, signal_table, warning_score, warning_summary)
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.stages import load_policy, load_reward_model  # noqa: E402
from mingpt_rlhf.lab.ensemble import COMBINE, UWO_LAMBDA, load_reward  # noqa: E402
from mingpt_rlhf.lab.hacking import ALARM_KL  # noqa: E402
from mingpt_rlhf.evaluate import generate_batches, response_texts  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "reward_hacking.json")
NOISE = (0.0, 0.25)                                 # train_rm.py --label_noise
RULES = ("single", "mean", "wco", "uwo", "warm")    # single: the ensemble's member 0 alone
KL_COEFS = (0.0, 0.02)                              # fixed KL coefficients of the PPO runs
MEMBERS = 4                                         # train_rm.py --ensemble
LENGTH_BIAS = 0.5                                   # train_rm.py --length_bias
HELDOUT_SEED = 1000                                 # the held-out RM's --data_seed: seed + this
N_MAX = overopt.N_MAX                               # best-of-n samples per prompt (256)
FULL = dict(sft={}, rm={}, ppo=dict(algo="ppo", critic="shared"), n=N_MAX, prompts=None,
            members=MEMBERS)
SMOKE = dict(sft=dict(n_layer=1, n_head=2, n_embd=32, block_size=48, batch_size=16, max_iters=20,
                      eval_interval=10, eval_prompts=16, warmup_iters=2),
             rm=dict(n_pairs=160, batch_size=16, eval_interval=5, norm_samples=32),
             ppo=dict(algo="ppo", critic="shared", max_iters=4, rollout_batch_size=16,
                      minibatch_size=8, ppo_epochs=1, eval_interval=2, eval_prompts=16,
                      max_new_tokens=24, warning_window=1),
             n=8, prompts=4, members=2)


def length_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """A reward that counts only length: the response's words (its "<eos>" not counted) / 10."""
    return [len([w for w in r.split() if w != "<eos>"]) / 10 for r in responses]


def where(root: str, name: str) -> str:
    return os.path.join(root, "hack", name)


def reward_models(seed: int, root: str, size: dict, noises) -> str:
    """The SFT policy and every reward model of the grid, each trained unless finished; returns
    the SFT folder."""
    sft = os.path.join(root, "sft")
    if size is FULL:
        details.stages(seed, root, ["baseline"])  # the SFT (and RM) bench/details.py uses
    else:
        results_file.train_stage(train_sft.main, train_sft.Config, sft, seed=seed, **size["sft"])
    common = dict(sft_dir=sft, seed=seed, **size["rm"])
    labellers = [(f"noise{p:g}", dict(label_noise=p)) for p in noises]
    labellers.append((f"length{LENGTH_BIAS:g}", dict(length_bias=LENGTH_BIAS)))
    for name, faults in labellers:
        members = size["members"] if name.startswith("noise") else 1
        results_file.train_stage(train_rm.main, train_rm.Config, where(root, f"rm_{name}"),
                                 ensemble=members, **faults, **common)
        results_file.train_stage(train_rm.main, train_rm.Config, where(root, f"heldout_{name}"),
                                 data_seed=seed + HELDOUT_SEED, **faults, **common)
    return sft


def ensembles(seed, root, result, path, noises) -> None:
    """Per ensemble: each member's and WARM's held-out figures (eval_acc, eval_gold_acc), and how
    far apart the members ended: the mean over pairs of members of ||a - b|| / ||a|| over the
    trunk's weights and over the head's (both trained, from one SFT trunk and seed-own heads)."""
    for noise in noises:
        key = f"rm/noise{noise:g}/{seed}"
        if key in result["runs"]:
            continue
        folder = where(root, f"rm_noise{noise:g}")
        names = [n for n in sorted(os.listdir(folder)) if n.startswith("member")] + ["warm"]
        figures = {n: {k: v for k, v in read_metrics(os.path.join(folder, n, "metrics.jsonl"))[-1].items()
                       if k in ("eval_acc", "eval_gold_acc", "eval_gold_corr")} for n in names}
        weights = [torch.load(os.path.join(folder, n, "ckpt.pt"), map_location="cpu", mmap=True,
                              weights_only=False)["model"] for n in names[:-1]]

        def distance(part):
            flat = [torch.cat([w[k].flatten().float() for k in w if k.startswith(part)]) for w in weights]
            pairs = [(a, b) for i, a in enumerate(flat) for b in flat[i + 1:]]
            return sum(((a - b).norm() / a.norm()).item() for a, b in pairs) / len(pairs)
        result["runs"][key] = {"figures": figures, "trunk_distance": distance("gpt."),
                               "head_distance": distance("head.")}
        results_file.save(path, result)


def reward_of(root: str, noise: float, rule: str) -> dict:
    """train_ppo.py's options for one reward of RULES under `noise`."""
    ensemble = where(root, f"rm_noise{noise:g}")
    if rule == "single":
        return dict(rm_dir=os.path.join(ensemble, "member0"))
    return dict(rm_dir=ensemble, ensemble_combine=rule)


@torch.no_grad()
def best_of_n(seed, root, result, path, size, noises, rules) -> None:
    """Best-of-n curves of each reward, from one set of samples of the SFT policy. Each member
    scores the samples once and every rule combines those scores, as RewardEnsemble would
    (a response cut off without EOS scores -1 by every member, so by every rule)."""
    todo = [(p, r) for p in noises for r in rules if f"bon/noise{p:g}/{r}/{seed}" not in result["runs"]]
    if not todo:
        return
    policy, tokenizer, _ = load_policy(os.path.join(root, "sft"))
    task = get_task("reviews", seed=seed)
    prompts = task.prompts("eval")[:size["prompts"]]
    texts, seqs, gold = overopt.sample_n(policy, tokenizer, task, prompts, seed, size["n"])
    for noise in dict.fromkeys(p for p, _ in todo):
        ensemble_dir = where(root, f"rm_noise{noise:g}")
        start = time.time()
        ensemble = load_reward(ensemble_dir, tokenizer)[0]
        members = torch.stack([overopt.proxy_scores(m, seqs) for m in ensemble.members])  # (K, P, N)
        per_model = (time.time() - start) / len(ensemble.members)  # seconds to score the samples
        for rule in [r for p, r in todo if p == noise]:
            seconds = per_model
            if rule == "single":
                proxy, models = members[0], ensemble.members[:1]
            elif rule == "warm":
                start = time.time()
                warm = load_reward(ensemble_dir, tokenizer, combine="warm")[0]
                proxy, models = overopt.proxy_scores(warm, seqs), [warm]
                seconds = time.time() - start
            else:
                proxy = COMBINE[rule](members.flatten(1), UWO_LAMBDA).view_as(members[0])
                models = ensemble.members
            result["runs"][f"bon/noise{noise:g}/{rule}/{seed}"] = {
                "curve": overopt.bon_curve(texts, gold, proxy), "sft_gold": gold.mean().item(),
                "params": params_of(models), "score_seconds": round(seconds * len(models), 2)}
            results_file.save(path, result)


def params_of(models) -> int:
    """Parameters of the reward models a reward scores with (an ensemble: all its members')."""
    return sum(p.numel() for m in models for p in m.parameters())


def reward_params(rm_dir: str, combine: str = "mean") -> int:
    rm = load_reward(rm_dir, combine=combine)[0]
    return params_of(rm.members if hasattr(rm, "members") else [rm])


def ppo_run(key, out, seed, result, path, size, **options) -> dict | None:
    """One PPO run (resumed if killed), stored as `key` with its curves and every iteration."""
    if key in result["runs"]:
        return None
    start = time.time()
    results_file.train_stage(train_ppo.main, train_ppo.Config, out, seed=seed, adaptive_kl=False,
                             **size["ppo"], **options)
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    # a reward from code logs its score as "reward": it is that run's proxy
    rows = [{"rm_score": r["reward"], **r} if "reward" in r else r for r in rows]
    curve, train_curve = overopt.curves_of(rows)
    train = [r for r in rows if "split" not in r and not r.get("final")]
    keep = ("step", "gold", "kl", "resp_len", "entropy", "rm_score", "ens_std", "heldout_gap",
            "hacking_warning")
    run = {"curve": curve, "train_curve": train_curve, "seconds": round(time.time() - start, 1),
           "iterations": {k: [r.get(k) for r in train] for k in keep},
           "t_score": sum(r["t_score"] for r in train) / len(train),  # per iteration, seconds
           "seconds_per_iteration": rows[-1]["time"] / max(len(train), 1),  # evals included
           "reward_params": reward_params(options["rm_dir"], options.get("ensemble_combine", "mean"))
           if "rm_dir" in options else 0}
    result["runs"][key] = run
    results_file.save(path, result)
    return run


def ppo(seed, root, result, path, size, noises, rules, coefs) -> None:
    """PPO against each reward at each KL coefficient, the held-out RM watching."""
    sft = os.path.join(root, "sft")
    for coef in coefs:
        for noise in noises:
            for rule in rules:
                ppo_run(f"ppo/noise{noise:g}/{rule}_kl{coef:g}/{seed}",
                        where(root, f"ppo_noise{noise:g}_{rule}_kl{coef:g}"), seed, result, path,
                        size, sft_dir=sft, kl_coef=coef,
                        heldout_rm_dir=where(root, f"heldout_noise{noise:g}"),
                        **reward_of(root, noise, rule))


@torch.no_grad()
def within_buckets(policy_dir: str, sft: str, rm_dir: str, seed: int, size: dict) -> dict:
    """The reward gain of a policy over the SFT policy on the held-out prompts, in total and
    within length buckets (responses of one number of words compared with each other, the
    buckets weighted by the policy's share of them), and the mean lengths."""
    task = get_task("reviews", seed=seed)
    prompts = task.prompts("eval")[:size["prompts"]] * 4  # 4 samples a prompt
    scored = {}
    for name, folder in (("sft", sft), ("policy", policy_dir)):
        policy, tokenizer, _ = load_policy(folder)
        rm = load_reward_model(rm_dir, tokenizer)
        gen = torch.Generator().manual_seed(seed)
        rows = []
        for out in generate_batches(policy, tokenizer, prompts, 32, 64, generator=gen):
            ended = ((out.sequences == tokenizer.eos_id) & out.action_mask.bool()).any(-1)
            scores = torch.where(ended, rm(out.sequences, out.attention_mask), -1.0)
            rows += [(len(t.split()), s) for t, s in zip(response_texts(tokenizer, out), scores.tolist())]
        scored[name] = rows
    by = {name: {} for name in scored}
    for name, rows in scored.items():
        for length, score in rows:
            by[name].setdefault(length, []).append(score)
    both = [n for n in by["policy"] if n in by["sft"]]
    weight = sum(len(by["policy"][n]) for n in both)

    def mean(v):
        return sum(v) / len(v)
    within = sum(len(by["policy"][n]) * (mean(by["policy"][n]) - mean(by["sft"][n])) for n in both)
    return {"reward_gain": mean([s for _, s in scored["policy"]]) - mean([s for _, s in scored["sft"]]),
            "within_bucket_gain": within / weight if weight else None,
            "bucket_share": weight / len(scored["policy"]),
            "length_sft": mean([n for n, _ in scored["sft"]]),
            "length_policy": mean([n for n, _ in scored["policy"]])}


def length(seed, root, result, path, size, coefs) -> None:
    """PPO against the length-biased RM, and against length alone, at each KL coefficient."""
    sft = os.path.join(root, "sft")
    name = f"length{LENGTH_BIAS:g}"
    for coef in coefs:
        out = where(root, f"ppo_{name}_kl{coef:g}")
        run = ppo_run(f"length/bias{LENGTH_BIAS:g}_kl{coef:g}/{seed}", out, seed, result, path, size,
                      sft_dir=sft, kl_coef=coef, rm_dir=where(root, f"rm_{name}"),
                      heldout_rm_dir=where(root, f"heldout_{name}"))
        if run is not None:
            run.update(within_buckets(out, sft, where(root, f"rm_{name}"), seed, size))
            results_file.save(path, result)
        ppo_run(f"length/length_only_kl{coef:g}/{seed}", where(root, f"ppo_length_only_kl{coef:g}"),
                seed, result, path, size, sft_dir=sft, kl_coef=coef,
                reward=f"{os.path.abspath(__file__)}:length_reward")


# ----------------------------------------------------------------------------- tables
def best_table(result: dict) -> str:
    """Per part, noise and reward: the best gold gain (mean over seeds of each seed's best point
    past the start) and its seed range, the proxy's gain there, the gold at the last point (n =
    N_MAX; PPO's last eval) and its range, the fall from best to last, and the scoring seconds
    per iteration (PPO)."""
    names = sorted({k.rsplit("/", 1)[0] for k in result["runs"] if k.startswith(("bon/", "ppo/", "length/"))})
    lines = ["| run | seeds | best gold gain (mean) | seeds' range | proxy gain there | last gold "
             "| its range | fall from best | t_score s |", "| --- " * 9 + "|"]
    for name in names:
        runs = [r for r in overopt.runs_of(result, name) if len(r["curve"]) > 1]
        if not runs:
            continue
        best = [max(r["curve"][1:], key=lambda p: p["gold"]) for r in runs]
        gold = [p["gold"] for p in best]
        last = [r["curve"][-1]["gold"] for r in runs]
        cost = [r["t_score"] for r in runs if "t_score" in r]
        mean = lambda v: sum(v) / len(v)  # noqa: E731
        lines.append(f"| {name} | {len(runs)} | {mean(gold):.3f} | {min(gold):.2f} to {max(gold):.2f} | "
                     f"{mean([p['proxy'] for p in best]):.3f} | {mean(last):.3f} | {min(last):.2f} to "
                     f"{max(last):.2f} | {mean(gold) - mean(last):.3f} | "
                     + (f"{mean(cost):.2f} |" if cost else "- |"))
    return "\n".join(lines)


def length_table(result: dict) -> str:
    lines = ["| run | seeds | gold gain (last eval) | tokens per response, first -> last iterations "
             "| reward gain (samples) | within length buckets |",
             "| --- " * 6 + "|"]
    for name in sorted({k.rsplit("/", 1)[0] for k in result["runs"] if k.startswith("length/")}):
        runs = overopt.runs_of(result, name)
        gain = sum(r["curve"][-1]["gold"] for r in runs) / len(runs)
        it = [r["iterations"]["resp_len"] for r in runs]
        w = SMOOTH
        first = sum(sum(x[:w]) / len(x[:w]) for x in it) / len(it)
        last = sum(sum(x[-w:]) / len(x[-w:]) for x in it) / len(it)
        buckets = [r for r in runs if "reward_gain" in r]
        tail = (f"{sum(r['reward_gain'] for r in buckets) / len(buckets):.3f} | "
                f"{sum(r['within_bucket_gain'] or 0 for r in buckets) / len(buckets):.3f}"
                if buckets else "- | -")
        lines.append(f"| {name} | {len(runs)} | {gain:.3f} | {first:.1f} -> {last:.1f} | {tail} |")
    return "\n".join(lines)


def draw(result: dict, png: str) -> None:
    """Gold and proxy against d, best-of-n and PPO at each KL coefficient, one row per noise."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    noises = sorted({k.split("/")[1] for k in result["runs"] if k.startswith(("bon/", "ppo/"))})
    coefs = sorted({k.split("_kl")[1].split("/")[0] for k in result["runs"] if k.startswith("ppo/")}, key=float)
    if not noises:
        return
    fig, axes = plt.subplots(len(noises), 1 + len(coefs), figsize=(5 * (1 + len(coefs)), 4 * len(noises)),
                             squeeze=False)
    for row, noise in zip(axes, noises):
        for col, (ax, part) in enumerate(zip(row, ["bon", *coefs])):
            for i, rule in enumerate(RULES):
                name = f"bon/{noise}/{rule}" if part == "bon" else f"ppo/{noise}/{rule}_kl{part}"
                runs = overopt.runs_of(result, name)
                if not runs:
                    continue
                curves = [r["curve"] for r in runs]
                d = overopt.mean_curve(curves, "d")
                ax.plot(d, overopt.mean_curve(curves, "gold"), "o-", ms=3, color=f"C{i}", label=f"{rule} gold")
                ax.plot(d, overopt.mean_curve(curves, "proxy"), ":", color=f"C{i}", alpha=0.6)
            ax.set_title(f"{'best-of-n' if part == 'bon' else 'PPO, KL coef ' + part}, {noise}", fontsize=10)
            ax.set_xlabel("d = sqrt(KL to the SFT policy)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--parts", nargs="+", default=["bon", "ppo", "length"], choices=["bon", "ppo", "length"])
    ap.add_argument("--noise", type=float, nargs="+", default=list(NOISE), help="label noise levels")
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    ap.add_argument("--kl_coefs", type=float, nargs="+", default=list(KL_COEFS))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (SMOKE), to check the code runs")
    ap.add_argument("--work", default="", help="where the runs go (default: out/bench_details, "
                                               "bench/details.py's seeds, or with --smoke "
                                               "out/bench_reward_hacking_smoke)")
    ap.add_argument("--results", default=RESULTS, help="the JSON to write")
    ap.add_argument("--merge", nargs="+", default=[], help="add these results files' runs to --results")
    ap.add_argument("--rerun", action="store_true", help="redo the chosen parts of the chosen seeds")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--table", action="store_true", help="print the tables")
    ap.add_argument("--draw_only", action="store_true", help="only summarise and draw")
    args = ap.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    work = args.work or os.path.join(ROOT, "out", "bench_reward_hacking_smoke" if args.smoke else "bench_details")
    path = os.path.abspath(args.results)
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.merge(path, args.merge) if args.merge else results_file.load(path)
    if args.rerun:
        result["runs"] = {k: v for k, v in result["runs"].items()
                          if int(k.rsplit("/", 1)[1]) not in args.seeds or k.split("/")[0] not in args.parts}
    if not (args.draw_only or args.merge):
        for seed in args.seeds:
            root = os.path.join(work, f"seed{seed}")
            reward_models(seed, root, size, args.noise)
            ensembles(seed, root, result, path, args.noise)
            if "bon" in args.parts:
                best_of_n(seed, root, result, path, size, args.noise, args.rules)
            if "ppo" in args.parts:
                ppo(seed, root, result, path, size, args.noise, args.rules, args.kl_coefs)
            if "length" in args.parts:
                length(seed, root, result, path, size, args.kl_coefs)
    result["warning"] = warning_summary(result)
    seeds = sorted({int(k.rsplit("/", 1)[1]) for k in result["runs"] if k.startswith("ppo/")})
    if len(seeds) > 1:  # thresholds fitted on all seeds but the last, scored on the last
        result["warning_calibration"] = {
            "fit_seeds": seeds[:-1], "test_seeds": seeds[-1:],
            "signals": calibrate(result, set(seeds[:-1]), {seeds[-1]}),
            "alarms": calibrate(result, set(seeds[:-1]), {seeds[-1]}, goal="caught"),
            # the library's rule (lab/hacking.py: the KL's level past ALARM_KL) on each side
            "rule": {side: rule_figures(result, {"kl_level": ALARM_KL}, 1, set(group))
                     for side, group in (("fit", seeds[:-1]), ("test", seeds[-1:]))}}
    results_file.save(path, result)
    if not args.smoke:
        try:
            draw(result, os.path.join(ROOT, "bench", "results", "reward_hacking.png"))
        except ImportError:
            print("matplotlib is not installed: no picture")
    print(best_table(result))
    print()
    print(length_table(result))
    print()
    print("warning:", result["warning"])
    print()
    print(signal_table(result))
    if "warning_calibration" in result:
        print()
        c = result["warning_calibration"]
        print(calibration_table(c["signals"]))
        print()
        print(calibration_table(c["alarms"], goal="caught"))
        print("the rule (KL level past", ALARM_KL, "):", c["rule"])
    return result


if __name__ == "__main__":
    main()
