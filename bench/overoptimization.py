"""Reward-model overoptimization (Gao, Schulman, Hilton 2023) on the built-in reviews task: the
gold reward against d = sqrt(KL to the SFT policy) while a policy is optimised against proxy
reward models of several sizes and training-set sizes, for best-of-n and for RL.

    python bench/overoptimization.py                    # seed 0, everything (50-65 min as one
                                                        # of 2-3 single-thread processes on 2
                                                        # CPU cores; --seeds 0 1 2 for three)
    python bench/overoptimization.py --parts bon        # best-of-n only (the RMs and sampling)
    python bench/overoptimization.py --draw_only        # the fits and the picture, from the JSON

Two processes can run two seeds at once (`--threads 1` each): one writes the default JSON,
the other `--results FILE`; then `--merge FILE` adds the second file's runs to the default one.

The setup, mapped onto the paper's: the task's exact gold reward plays the paper's "gold"
reward model (standing in for people); the task's noisy labeller, which prefers the response
of higher gold with a logistic probability, labels the pairs; proxy reward models are
train_rm.py's, started from SFT models of the sizes in SIZES (each trained by train_sft.py on
the same demonstrations; size "m" is the default pipeline's SFT, which is also the policy), on
the numbers of pairs in PAIRS, and all normalised on the policy's samples (`--norm_policy`). Nothing of the default pipeline changes: sizes and pair counts
are the scripts' options.

For each seed, in --work/seed{seed} (the SFT policy is the one bench/details.py trains):
- best-of-n: the SFT policy samples N_MAX = 256 responses to each of the 200 held-out prompts,
  once; every proxy scores them (normalised, the missing-EOS penalty as in PPO) and so does the
  gold. For n = 1, 2, 4, ... 256 the expected gold and proxy of the response a proxy picks
  among n are computed exactly from the 256 (the chance that the i-th lowest of N is the
  highest of a random n of them is C(i-1, n-1) / C(N, n)), and d = sqrt(log n - (n - 1) / n);
- RL: PPO (a value head on the actor, `--critic shared`, so that the critic does not change
  size with the proxy) and GRPO, 200 iterations each against each size's proxy trained on the
  most pairs, with a fixed KL coefficient of 0 and of each value in KL_COEFS; every eval (each
  20 iterations, 200 held-out prompts) gives a point: the gold, the proxy (rm_score) and d =
  sqrt of the measured KL; every iteration's own 64 training responses give a noisier one;
- slow: PPO against proxy m at KL coefficient 0 and 0.1 with both learning rates divided by 4,
  to see whether the penalty's gold at equal KL comes from the time a run spends there;
- the gold is counted from the SFT policy's (gold(0) = 0), and the two forms are fitted to
  each curve by mingpt_rlhf/lab/overoptimization.py;
- --table prints the fits, RL at every iteration, gold and proxy at equal d by KL coefficient
  (binned), and the default PPO run's KL against best-of-n's for the same gold.

Every piece is written to bench/results/overoptimization.json as it ends and is not redone
(--rerun to redo): a killed bench continues. Writes overoptimization.png.
"""
from __future__ import annotations

import argparse
import math
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
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.methods.bestofn import best_of_n_kl, best_of_n_kl_exact, best_of_n_weights  # noqa: E402
from mingpt_rlhf.stages import load_policy, load_reward_model  # noqa: E402
from mingpt_rlhf.evaluate import generate_batches, response_texts  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.lab.overoptimization import fit  # noqa: E402
from mingpt_rlhf.ppo_trainer import resolve_auto_options  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "overoptimization.json")
SIZES = {  # proxy size: train_sft.py model options ("m" is the default, and the policy)
    "xs": dict(n_layer=1, n_head=2, n_embd=32),
    "s": dict(n_layer=2, n_head=2, n_embd=64),
    "m": {},
    "l": dict(n_layer=6, n_head=6, n_embd=192),
}
PAIRS = (1500, 6000, 24000)   # train_rm.py --n_pairs; 24000 is the default
N_MAX = 256                   # best-of-n samples per prompt
KL_COEFS = (0.02, 0.1)        # fixed KL coefficients of the RL runs, besides 0
RL_METHODS = {"ppo": dict(algo="ppo", critic="shared"), "grpo": dict(algo="grpo")}
# "slow": PPO against proxy m at KL coefficient 0 and the largest, with both learning rates
# (train_ppo.py's defaults for a reward model) divided by 4: does a run that crosses each KL
# more slowly reach the penalised runs' gold at equal KL?
SLOW = dict(size="m", coefs=(0.0, max(KL_COEFS)), lr_divisor=4)


def rm_dir(root: str, size: str, pairs: int) -> str:
    return os.path.join(root, "overopt", f"rm_{size}_{pairs}")


def proxies(seed: int, root: str) -> None:
    """The SFT model of each size (the default one from bench/details.py's stages) and a proxy
    RM of each size on each number of pairs, each trained unless already finished. Every proxy
    is normalised on the policy's samples (--norm_policy: the default SFT), so that the same KL
    coefficient and reward clip mean the same against every size."""
    details.stages(seed, root, ["baseline"])
    policy = os.path.join(root, "sft")
    for size, model in SIZES.items():
        sft = policy if not model else os.path.join(root, "overopt", f"sft_{size}")
        if model:
            results_file.train_stage(train_sft.main, train_sft.Config, sft, seed=seed, **model)
        for pairs in PAIRS:
            results_file.train_stage(train_rm.main, train_rm.Config, rm_dir(root, size, pairs),
                                     sft_dir=sft, seed=seed, n_pairs=pairs, norm_policy=policy)


def params_of(path: str) -> int:
    """Parameters of the model saved in a checkpoint."""
    ckpt = torch.load(os.path.join(path, "ckpt.pt"), map_location="cpu", weights_only=False,
                      mmap=True)
    return sum(v.numel() for v in ckpt["model"].values())


@torch.no_grad()
def sample_n(policy, tokenizer, task, prompts: list[str], seed: int, n: int = N_MAX):
    """n responses per prompt from `policy` (32 new tokens at most, temperature 1): (texts per
    prompt, (sequences, attention_mask, ended) per prompt, gold (P, n) float64)."""
    gen = torch.Generator().manual_seed(seed)
    texts, seqs = [], []
    for prompt in prompts:
        for out in generate_batches(policy, tokenizer, [prompt] * n, 32, n, generator=gen):
            texts.append(response_texts(tokenizer, out))
            ended = ((out.sequences == tokenizer.eos_id) & out.action_mask.bool()).any(-1)
            seqs.append((out.sequences, out.attention_mask, ended))
    gold = torch.tensor([[task.gold_reward(p, r) for r in rs] for p, rs in zip(prompts, texts)],
                        dtype=torch.float64)                                    # (P, n)
    return texts, seqs, gold


@torch.no_grad()
def proxy_scores(rm, seqs) -> torch.Tensor:
    """(P, n) float64: `rm`'s normalised scores of sample_n's samples, -1 (PPO's missing-EOS
    penalty) for those that never reached EOS. `rm` may be an ensemble (its rule)."""
    return torch.stack([torch.where(ended, rm(s, m).double(), -1.0) for s, m, ended in seqs])


def bon_curve(texts: list[list[str]], gold: torch.Tensor, proxy: torch.Tensor) -> list[dict]:
    """Best-of-n by `proxy` for n = 1, 2, 4, ... N (N samples per prompt): per n, d (from log n
    - (n - 1) / n), d_exact (from the exact KL of best-of-n on these samples, ties counted) and
    the expected gold and proxy of the response picked, both counted from the samples' mean."""
    N = proxy.size(1)
    order = proxy.argsort(-1)                                   # ascending, per prompt
    g_sorted, p_sorted = gold.gather(1, order), proxy.gather(1, order)
    empirical = []  # per prompt: (probabilities, proxy score) of its distinct responses
    for rs, scores in zip(texts, proxy):
        share = {}
        for r, sc in zip(rs, scores.tolist()):
            count, _ = share.get(r, (0, sc))
            share[r] = (count + 1, sc)
        counts, values = zip(*share.values())
        empirical.append((torch.tensor(counts, dtype=torch.float64) / N,
                          torch.tensor(values, dtype=torch.float64)))
    curve = []
    n = 1
    while n <= N:
        w = best_of_n_weights(N, n)
        exact = sum(best_of_n_kl_exact(p, v, n) for p, v in empirical) / len(empirical)
        curve.append({"n": n, "d": math.sqrt(best_of_n_kl(n)), "d_exact": math.sqrt(exact),
                      "gold": (g_sorted @ w).mean().item() - gold.mean().item(),
                      "proxy": (p_sorted @ w).mean().item() - proxy.mean().item()})
        n *= 2
    return curve


@torch.no_grad()
def best_of_n(seed: int, root: str, result: dict) -> None:
    """Sample N_MAX responses per held-out prompt from the SFT policy, score them with the gold
    and every proxy, and store per proxy the best-of-n curve (n = 1, 2, 4, ... N_MAX)."""
    todo = [(s, p) for s in SIZES for p in PAIRS if f"bon/{s}/{p}/{seed}" not in result["runs"]]
    if not todo:
        return
    policy, tokenizer, _ = load_policy(os.path.join(root, "sft"))
    task = get_task("reviews", seed=seed)
    prompts = task.prompts("eval")
    start = time.time()
    texts, seqs, gold = sample_n(policy, tokenizer, task, prompts, seed)
    # a small vocabulary repeats responses: identical ones tie on every proxy, and with ties
    # log n - (n - 1)/n overstates best-of-n's KL (methods/bestofn.py), so the exact KL of best-of-n
    # on each prompt's 256 samples (as a distribution: each distinct response at its share)
    # is measured beside it
    distinct = [len(set(rs)) / N_MAX for rs in texts]
    seconds = time.time() - start
    for size, pairs in todo:
        rm = load_reward_model(rm_dir(root, size, pairs), tokenizer)
        curve = bon_curve(texts, gold, proxy_scores(rm, seqs))
        result["runs"][f"bon/{size}/{pairs}/{seed}"] = {
            "curve": curve, "params": params_of(rm_dir(root, size, pairs)),
            "sft_gold": gold.mean().item(), "sampling_seconds": round(seconds, 1),
            "distinct_share": sum(distinct) / len(distinct),
            "rm_eval_acc": read_metrics(os.path.join(rm_dir(root, size, pairs), "metrics.jsonl"))[-1].get("eval_acc")}
        results_file.save(RESULTS, result)


def curves_of(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """An RL run's metrics.jsonl rows as two curves of (step, d, kl, gold, proxy), gold and proxy
    counted from the first eval's (the SFT policy's): the evals (200 held-out prompts), and
    every iteration's own rollouts (64 training responses, sampled before that iteration's
    update: noisier, but dense where d rises fastest). The run's final summary repeats the last
    eval without a split; it belongs to neither."""
    evals = [r for r in rows if r.get("split") == "eval" and "gold" in r]
    trains = [r for r in rows if "split" not in r and "gold" in r and not r.get("final")]
    gold0, proxy0 = evals[0]["gold"], evals[0]["rm_score"]

    def point(r):
        # the logged KL is a batch mean of each response's k1 = sum of log pi - log pi_sft: its
        # expectation is the KL (>= 0), but one batch's mean can read slightly below 0 while the
        # policy is still near the SFT policy (-0.031 to -0.0005 at iterations 2-3 of some runs
        # here); d counts such a point as 0, and "kl" keeps the value as measured
        return {"step": r["step"], "d": math.sqrt(max(r["kl"], 0.0)), "kl": r["kl"],
                "gold": r["gold"] - gold0, "proxy": r["rm_score"] - proxy0}
    return [point(r) for r in evals], [point(r) for r in trains]


def rl_run(key: str, out: str, seed: int, root: str, result: dict, size: str, method: str,
           coef: float, **options) -> None:
    """One RL run against size's proxy (most pairs) at a fixed KL coefficient, stored as `key`."""
    if key in result["runs"]:
        return
    start = time.time()
    train_ppo.main(train_ppo.Config(
        out_dir=out, sft_dir=os.path.join(root, "sft"), rm_dir=rm_dir(root, size, max(PAIRS)),
        seed=seed, kl_coef=coef, adaptive_kl=False, **RL_METHODS[method], **options))
    curve, train_curve = curves_of(read_metrics(os.path.join(out, "metrics.jsonl")))
    result["runs"][key] = {"curve": curve, "train_curve": train_curve,
                           "params": params_of(rm_dir(root, size, max(PAIRS))),
                           "seconds": round(time.time() - start, 1)}
    results_file.save(RESULTS, result)


def rl(seed: int, root: str, result: dict, methods: list[str]) -> None:
    """RL against each size's proxy (most pairs), KL coefficient 0 and KL_COEFS, fixed; in
    the order that gives the main curves first (no penalty, every size) if the bench stops."""
    for coef in (0.0, *KL_COEFS):
        for method in methods:
            for size in SIZES:
                rl_run(f"rl/{size}/{method}_kl{coef:g}/{seed}",
                       os.path.join(root, "overopt", f"{method}_{size}_kl{coef:g}"),
                       seed, root, result, size, method, coef)


def slow(seed: int, root: str, result: dict) -> None:
    """The SLOW runs: PPO at a quarter of the learning rates, KL coefficient 0 and the largest."""
    default = resolve_auto_options(train_ppo.Config(**RL_METHODS["ppo"]))
    lrs = dict(actor_lr=default.actor_lr / SLOW["lr_divisor"],
               critic_lr=default.critic_lr / SLOW["lr_divisor"])
    for coef in SLOW["coefs"]:
        rl_run(f"slow/{SLOW['size']}/ppo_kl{coef:g}/{seed}",
               os.path.join(root, "overopt", f"slow_ppo_{SLOW['size']}_kl{coef:g}"), seed, root,
               result, SLOW["size"], "ppo", coef, **lrs)


def runs_of(result: dict, name: str) -> list[dict]:
    """Every seed's run of the curve `name` (a run's key without its seed)."""
    return [r for k, r in result["runs"].items() if k.rsplit("/", 1)[0] == name]


def mean_curve(curves: list[list[dict]], key: str) -> list[float]:
    """Point by point, the mean of `key` over the curves (as long as the shortest)."""
    n = min(len(c) for c in curves)
    return [sum(c[i][key] for c in curves) / len(curves) for i in range(n)]


def crossing(xs: list[float], x: float) -> tuple[int, float] | None:
    """The first i >= 1 with xs[i] >= x and where x lies between xs[i - 1] and xs[i] (0 to 1);
    None if xs never reaches x."""
    i = next((i for i in range(1, len(xs)) if xs[i] >= x), None)
    return None if i is None else (i, (x - xs[i - 1]) / (xs[i] - xs[i - 1]))


def fits(result: dict) -> None:
    """Per curve (mean over the seeds run, point by point), both forms fitted to gold(d)."""
    names = dict.fromkeys(key.rsplit("/", 1)[0] for key in result["runs"])
    result["fits"] = {}
    for name in names:
        runs = runs_of(result, name)
        curves = [r["curve"] for r in runs]
        d, gold = mean_curve(curves, "d"), mean_curve(curves, "gold")
        entry = {"seeds": len(runs), "d": d, "gold": gold}
        for form in ("bon", "rl"):
            try:
                entry[form] = fit(form, d, gold)
            except ValueError as e:
                entry[form] = {"error": str(e)}
        dense = [r["train_curve"] for r in runs if "train_curve" in r]
        if dense:  # RL at every iteration, on its own rollouts (the seeds that logged them)
            dd, dg = mean_curve(dense, "d"), mean_curve(dense, "gold")
            entry["dense"] = {"seeds": len(dense), "d": dd, "gold": dg, "rl": fit("rl", dd, dg)}
        if all("d_exact" in c[0] for c in curves):  # best-of-n against its exact KL (ties)
            entry["d_exact"] = mean_curve(curves, "d_exact")
            entry["bon_exact"] = fit("bon", entry["d_exact"], gold)
        result["fits"][name] = entry


def markdown_table(result: dict) -> str:
    """docs/overoptimization.md's table: per curve the proxy's parameters, the highest gold
    gain of the mean curve and the d where it was measured, the range of each seed's highest
    (both past the starting point, whose gain is 0 by definition, so a run that never rose
    shows a loss), and the paper's form fitted (alpha, beta, r2, the fitted peak d)."""
    lines = ["| curve | proxy params | best gold gain (at d) | each seed's best | form | alpha | beta | r2 | fitted peak d |",
             "| --- " * 9 + "|"]
    def order(name):  # best-of-n by size and pairs, then RL by method, coefficient and size
        part, size, which = name.split("/")
        sizes = list(SIZES)
        if part == "bon":
            return (0, sizes.index(size), int(which))
        method, coef = which.split("_kl")
        return (1 if part == "rl" else 2, list(RL_METHODS).index(method), float(coef), sizes.index(size))
    for name, f in sorted(result["fits"].items(), key=lambda item: order(item[0])):
        runs = runs_of(result, name)
        best = max(range(1, len(f["gold"])), key=lambda i: f["gold"][i])
        form = "bon" if name.startswith("bon") else "rl"
        g = f[form]
        each = [max(p["gold"] for p in r["curve"][1:]) for r in runs]
        coefficients = (f"{g['alpha']:.3f} | {g['beta']:.3f} | {g['r2']:.3f}" if "alpha" in g
                        else "- | - | -")
        lines.append(f"| {name} | {runs[0]['params'] / 1e6:.2f}M | {f['gold'][best]:.3f} (d "
                     f"{f['d'][best]:.2f}) | {min(each):.2f} to {max(each):.2f} | {form} | "
                     f"{coefficients} | {peak_text(g, f['d'])} |")
    return "\n".join(lines)


def peak_text(g: dict, d: list[float]) -> str:
    """A fit's peak, or what it means when the fit has none or puts it nowhere near the data."""
    if "alpha" not in g:
        return g.get("error", "no fit")
    peak_d = g["peak_d"]
    if g["alpha"] <= 0:  # the fitted gold falls (or first dips) from d = 0
        return "none (no rise)"
    if peak_d == math.inf:
        return "none (never turns down)"
    if peak_d > 3 * max(d):
        return "far past the data"
    return f"{peak_d:.2f}"


def dense_table(result: dict) -> str:
    """RL at every iteration (its own rollouts), where logged: d and gold after 1, 5 and 20
    iterations (the rising side, which evals every 20 iterations see in one point), and the RL
    form fitted to all the iterations."""
    lines = ["| curve | seeds | d, gold after 1 / 5 / 20 iterations | alpha | beta | r2 | fitted peak d |",
             "| --- " * 7 + "|"]
    for name, f in result["fits"].items():
        if "dense" not in f:
            continue
        g, d, gold = f["dense"]["rl"], f["dense"]["d"], f["dense"]["gold"]
        # point i holds the rollouts sampled after i updates
        after = " / ".join(f"{d[i]:.2f}, {gold[i]:.2f}" for i in (1, 5, 20) if i < len(d))
        lines.append(f"| {name} | {f['dense']['seeds']} | {after} | {g['alpha']:.3f} | "
                     f"{g['beta']:.3f} | {g['r2']:.3f} | {peak_text(g, d)} |")
    return "\n".join(lines)


D_BINS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)


def frontier_table(result: dict, key: str = "gold") -> str:
    """Gold (or the proxy, key="proxy") at equal d: every iteration in bins of d (each seed's
    mean in a bin, then the mean over the seeds that reached it), per proxy size, method and KL
    coefficient, with best-of-n's gold (its mean curve, linear between points, at
    the bin's middle) for reference. If a KL penalty only stops a run earlier on the same curve,
    the coefficients' rows agree bin by bin; a bin with fewer than 5 points shows '-'."""
    bins = list(zip(D_BINS[:-1], D_BINS[1:]))
    head = " | ".join(f"d {lo:g}-{hi:g}" for lo, hi in bins)
    lines = [f"| proxy | run ({key}) | {head} |", "| --- " * (2 + len(bins)) + "|"]
    for size in SIZES:
        bon = [r["curve"] for r in runs_of(result, f"bon/{size}/{max(PAIRS)}")]
        if bon:
            d, y = mean_curve(bon, "d"), mean_curve(bon, key)

            def interp(x):
                if x > d[-1]:
                    return "-"
                i, t = crossing(d, x)
                return f"{y[i - 1] + t * (y[i] - y[i - 1]):.2f}"
            lines.append(f"| {size} | best-of-n | " + " | ".join(interp((lo + hi) / 2) for lo, hi in bins) + " |")
        rows = [(f"rl/{size}/{method}_kl{coef:g}", f"{method} KL {coef:g}")
                for method in RL_METHODS for coef in (0.0, *KL_COEFS)]
        if size == SLOW["size"]:
            rows += [(f"slow/{size}/ppo_kl{coef:g}", f"ppo KL {coef:g}, learning rates / 4")
                     for coef in SLOW["coefs"]]
        for name, label in rows:
            seeds = [r["train_curve"][1:] for r in runs_of(result, name)  # after an update
                     if "train_curve" in r]
            if not seeds:
                continue
            cells = []
            for lo, hi in bins:  # each seed's mean, then theirs: no seed outweighs another
                in_bin = [[p[key] for p in c if lo <= p["d"] < hi] for c in seeds]
                means = [sum(v) / len(v) for v in in_bin if v]
                enough = sum(map(len, in_bin)) >= 5
                cells.append(f"{sum(means) / len(means):.2f}" if enough else "-")
            lines.append(f"| {size} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ppo_against_best_of_n(result: dict) -> str:
    """Per seed: the default PPO run's gold and KL (bench/details.py's `baseline`, same SFT
    policy and proxy size m), and the KL best-of-n needs for that gold with proxy m on the most
    pairs (linear between its points in d; KL = d^2)."""
    path = os.path.join(ROOT, "bench", "results", "details.json")
    if not os.path.exists(path):
        return "bench/results/details.json is missing: run bench/details.py for the default PPO run"
    details_runs = results_file.load(path)["runs"]
    lines = ["| seed | default PPO gold | PPO KL | best-of-n KL for that gold (n) | PPO KL / best-of-n KL |",
             "| --- " * 5 + "|"]
    for key, run in sorted(result["runs"].items()):
        if not key.startswith(f"bon/m/{max(PAIRS)}/"):
            continue
        seed = key.rsplit("/", 1)[1]
        ppo = details_runs.get(f"baseline/{seed}")
        if ppo is None:
            continue
        gain, c = ppo["gold"] - run["sft_gold"], run["curve"]
        if gain <= 0:  # no gain to match: n = 1 (the SFT policy itself) has it
            lines.append(f"| {seed} | {ppo['gold']:.3f} | {ppo['kl']:.2f} | 0 (1) | - |")
            continue
        where = crossing([p["gold"] for p in c], gain)
        if where is None:
            lines.append(f"| {seed} | {ppo['gold']:.3f} | {ppo['kl']:.2f} | not reached by n = {N_MAX} | - |")
            continue
        i, t = where
        d = c[i - 1]["d"] + t * (c[i]["d"] - c[i - 1]["d"])
        lines.append(f"| {seed} | {ppo['gold']:.3f} | {ppo['kl']:.2f} | {d * d:.2f} ({c[i - 1]['n']}-"
                     f"{c[i]['n']}) | {ppo['kl'] / (d * d):.1f}x |")
    return "\n".join(lines)


def draw(result: dict, png: str) -> None:
    """Gold and proxy against d for best-of-n (each size, most pairs), for PPO and GRPO without
    KL penalty (each size); best-of-n's gold for each number of pairs (size m); the KL
    coefficients' gold(d) for PPO and GRPO (size m); alpha and beta against proxy size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    F = result.get("fits", {})
    fig, axes = plt.subplots(2, 4, figsize=(20, 9))
    sizes = list(SIZES)

    def line(ax, name, label, key="gold", **style):
        runs = runs_of(result, name)
        if not runs:
            return
        curves = [r["curve"] for r in runs]
        ax.plot(mean_curve(curves, "d"), mean_curve(curves, key), marker="o", ms=3, label=label, **style)
        dense = [r["train_curve"] for r in runs if "train_curve" in r]
        if dense:  # every iteration: faint dots (d is not monotone)
            ax.scatter(mean_curve(dense, "d"), mean_curve(dense, key), s=3, alpha=0.3,
                       color=style.get("color"))
    big = max(PAIRS)
    panels = [("best-of-n: gold", "bon/{s}/%d" % big, "gold"), ("best-of-n: proxy", "bon/{s}/%d" % big, "proxy"),
              ("PPO, no KL penalty: gold", "rl/{s}/ppo_kl0", "gold"), ("GRPO, no KL penalty: gold", "rl/{s}/grpo_kl0", "gold")]
    for ax, (title, pattern, key) in zip(axes[0], panels):
        for i, s in enumerate(sizes):
            line(ax, pattern.format(s=s), f"proxy {s}", key, color=f"C{i}")
        ax.set_title(title, fontsize=10)
    for pairs_i, pairs in enumerate(PAIRS):
        line(axes[1, 0], f"bon/m/{pairs}", f"{pairs} pairs", color=f"C{pairs_i}")
    axes[1, 0].set_title("best-of-n, proxy m: gold by training pairs", fontsize=10)
    for ax, method in zip(axes[1, 1:3], ("ppo", "grpo")):
        for i, coef in enumerate((0.0, *KL_COEFS)):
            line(ax, f"rl/m/{method}_kl{coef:g}", f"KL coef {coef:g}", color=f"C{i}")
        line(ax, f"bon/m/{big}", "best-of-n", color="k", ls="--")
        ax.set_title(f"{method.upper()} against proxy m: gold by KL coefficient", fontsize=10)
    ax = axes[1, 3]
    for name, form, style in ((f"bon/{{s}}/{big}", "bon", "o-"), ("rl/{s}/ppo_kl0", "rl", "s-"),
                              ("rl/{s}/grpo_kl0", "rl", "^-")):
        xs, alphas, betas = [], [], []
        for s in sizes:
            f = F.get(name.format(s=s), {}).get(form, {})
            runs = runs_of(result, name.format(s=s))
            if "alpha" in f and runs:
                xs.append(runs[0]["params"])
                alphas.append(f["alpha"])
                betas.append(f["beta"])
        label = name.split("/")[0] + ("" if form == "bon" else " " + name.split("/")[2])
        ax.plot(xs, alphas, style, label=f"alpha, {label}")
        ax.plot(xs, betas, style, label=f"beta, {label}", alpha=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("proxy parameters")
    ax.set_title("fitted coefficients against proxy size", fontsize=10)
    for ax in axes.flat:
        if ax is not axes[1, 3]:
            ax.set_xlabel("d = sqrt(KL to the SFT policy), nats^0.5")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main():
    global RESULTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--parts", nargs="+", default=["bon", "rl", "slow"], choices=["bon", "rl", "slow"],
                    help="bon: best-of-n; rl: PPO and GRPO at each KL coefficient; slow: PPO "
                         "against proxy m at a quarter of the learning rates")
    ap.add_argument("--methods", nargs="+", default=list(RL_METHODS), choices=list(RL_METHODS))
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_details"),
                    help="where bench/details.py keeps each seed's SFT (the policy)")
    ap.add_argument("--rerun", action="store_true", help="redo what the JSON already has")
    ap.add_argument("--draw_only", action="store_true", help="only fit and draw")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--table", action="store_true", help="print docs/overoptimization.md's table")
    ap.add_argument("--results", default=RESULTS, help="the JSON to write (another file lets a "
                                                        "second process run other seeds at once)")
    ap.add_argument("--merge", nargs="+", default=[], help="add these results files' runs to "
                                                           "bench/results/overoptimization.json, "
                                                           "fit and draw")
    args = ap.parse_args()
    RESULTS = os.path.abspath(args.results)
    os.environ.setdefault("MINGPT_RLHF_PLOT", "0")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.load(RESULTS)
    if args.merge:
        result = results_file.merge(RESULTS, args.merge)
        args.draw_only = True
    if args.rerun:  # the chosen parts of the chosen seeds
        result["runs"] = {k: v for k, v in result["runs"].items()
                          if int(k.rsplit("/", 1)[1]) not in args.seeds or k.split("/")[0] not in args.parts}
    if not args.draw_only:
        for seed in args.seeds:
            root = os.path.join(args.work, f"seed{seed}")
            proxies(seed, root)
            if "bon" in args.parts:
                best_of_n(seed, root, result)
            if "rl" in args.parts:
                rl(seed, root, result, args.methods)
            if "slow" in args.parts:
                slow(seed, root, result)
    fits(result)
    results_file.save(RESULTS, result)
    try:
        draw(result, os.path.join(ROOT, "bench", "results", "overoptimization.png"))
    except ImportError:
        print("matplotlib is not installed: no picture")
    if args.table:
        print(markdown_table(result))
        print()
        print(dense_table(result))
        print()
        print(frontier_table(result))
        print()
        print(frontier_table(result, "proxy"))
        print()
        print(ppo_against_best_of_n(result))
        return
    for name, f in result["fits"].items():
        form = "bon" if name.startswith("bon") else "rl"
        g = f[form]
        if "alpha" in g:
            print(f"{name:24s} seeds {f['seeds']}  alpha {g['alpha']:.3f} beta {g['beta']:.3f} "
                  f"r2 {g['r2']:.3f} peak d {g['peak_d']:.2f}  max gold {max(f['gold']):.3f}")


if __name__ == "__main__":
    main()
