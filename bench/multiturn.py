"""Multi-turn RL on the built-in guessing game: what RL finds that imitation cannot.

    python bench/multiturn.py                      # 3 seeds, every method (~1 h on 2 CPU cores)
    python bench/multiturn.py --seeds 0 --methods grpo
    python bench/multiturn.py --draw_only          # redraw the picture from the JSON
    python bench/multiturn.py --methods grpo --options="--kl_coef 0.2"   # a variant, keyed apart
    python bench/multiturn.py --actor_lr 5e-5 --methods grpo rloo ppo \
        --results bench/results/multiturn_lr5e-5.json --work out/bench_multiturn_lr5e-5
                                                   # the same at another learning rate

For each seed: SFT on the teacher's episodes (`train_sft.py --env guess`; the teacher guesses
uniformly among the numbers still possible), then from that SFT policy GRPO, RLOO and PPO
(shared critic), each with train_ppo.py's defaults for episodes and the game's per-turn budget
of 3 tokens, and GRPO once more with the environment's tokens left unmasked (`--mask_env
false`: they count as actions), to show what the mask is for. Every policy (SFT included) then
plays the same 400 held-out episodes (seeds 0..399); the figures are success (the share won
within the game's 6 guesses), mean turns (binary search, the optimum: 3.27; the teacher: 4.08),
where each guess falls inside the numbers still possible (0.5 = the middle), KL to the SFT
policy (nats per episode: `kl` from the run's last eval, as the run logs it; `kl_actions` on the
400 episodes, summed over the policy's own tokens only, whatever the run masked), RL seconds,
the seconds of sampling among them, and tokens generated.

Each run's result is written to bench/results/multiturn.json as soon as it ends, and a run
already there is not run again (--rerun to redo), so an interrupted benchmark continues.
Writes bench/results/multiturn.json and multiturn.png.
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
import train_sft  # noqa: E402
from mingpt_rlhf.ppo_trainer import resolve_auto_options  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402
from mingpt_rlhf.methods.env_guess import GuessNumber, optimal_turns, teacher_success, teacher_turns, where_in_interval  # noqa: E402
from mingpt_rlhf.methods.episodes import EpisodeSource, play_and_measure  # noqa: E402
from mingpt_rlhf.logprobs import sequence_logprobs  # noqa: E402
from mingpt_rlhf.machinery.cli import build_parser  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "multiturn.json")
TURN_TOKENS = 3          # a guess is one number and EOS; one token to spare
HELD_OUT = 400           # episodes every policy plays at the end (seeds 0..399)
METHODS = {"grpo": dict(algo="grpo"), "rloo": dict(algo="rloo"),
           "ppo": dict(algo="ppo"), "grpo_unmasked": dict(algo="grpo", mask_env=False)}
BINS = 10                # the histogram of where guesses fall, over [0, 1]
COLOURS = {"sft": "tab:gray", "grpo": "tab:blue", "rloo": "tab:orange", "ppo": "tab:green",
           "grpo_unmasked": "tab:red"}


@torch.no_grad()
def held_out(out_dir: str, sft_dir: str | None = None) -> dict:
    """The policy in `out_dir` on HELD_OUT held-out episodes: success, turns, where its guesses
    fall (a histogram over [0, 1] of BINS bins, and the mean distance to the middle), and with
    `sft_dir` its KL to the SFT policy on these episodes, summed over the policy's own tokens
    only (kl_actions: what the run's `kl` measures when the mask is on)."""
    policy, tokenizer, _ = load_policy(out_dir, flag="--ckpt_dir")
    source = EpisodeSource(GuessNumber, "guess", tokenizer, max_turns=GuessNumber.TURNS)
    cfg = argparse.Namespace(max_new_tokens=TURN_TOKENS, temperature=1.0)
    figures, transcripts = play_and_measure(policy, source, range(HELD_OUT), cfg, 100,
                                            torch.Generator().manual_seed(0))
    where = [w for t in transcripts for w in where_in_interval(t)]
    counts = [0] * BINS
    for w in where:
        counts[min(int(w * BINS), BINS - 1)] += 1
    figures["where"] = [c / max(1, len(where)) for c in counts]
    figures["example"] = transcripts[1]
    if sft_dir is not None:
        sft = load_policy(sft_dir, flag="--sft_dir")[0]
        kls, gen = [], torch.Generator().manual_seed(0)
        for i in range(0, HELD_OUT, 100):
            ep = source.play(policy, list(range(i, i + 100)), cfg, gen)
            T, acted = ep.prompt_len, ep.action_mask[:, ep.prompt_len:]
            lp = sequence_logprobs(policy, ep.sequences, ep.attention_mask, T, suppress=tokenizer.pad_id)[0]
            ref = sequence_logprobs(sft, ep.sequences, ep.attention_mask, T, suppress=tokenizer.pad_id)[0]
            kls += ((lp - ref) * acted).sum(-1).tolist()
        figures["kl_actions"] = sum(kls) / len(kls)
    return figures


def run_sft(seed: int, out: str) -> dict:
    start = time.time()
    train_sft.main(train_sft.Config(out_dir=out, env="guess", seed=seed,
                                    max_new_tokens=TURN_TOKENS))
    return {"seconds": round(time.time() - start, 1), **held_out(out)}


def flags(options: str) -> dict:
    """train_ppo.py flags as Config fields: "--kl_coef 0.2" -> {"kl_coef": 0.2}."""
    words = options.split()
    given = vars(build_parser(train_ppo.Config).parse_args(words))
    return {flag[2:]: given[flag[2:]] for flag in words[::2]}


def run_rl(seed: int, sft: str, out: str, options: dict, iters: int, actor_lr: float) -> dict:
    start = time.time()
    train_ppo.main(train_ppo.Config(**{**dict(out_dir=out, sft_dir=sft, env="guess", seed=seed,
                                              max_new_tokens=TURN_TOKENS, max_iters=iters,
                                              actor_lr=actor_lr), **options}))
    seconds = time.time() - start
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    evals = [r for r in rows if r.get("split") == "eval"]
    figures = held_out(out, sft)
    figures.update(seconds=round(seconds, 1), measured=results_file.measured(ROOT),
                   ran_with=results_file.ran_with(out), kl=rows[-1]["kl"],
                   gen_tokens=sum(r.get("gen_tokens", 0) for r in rows if "pg_loss" in r),
                   t_generate=sum(r.get("t_generate", 0) for r in rows if "pg_loss" in r),
                   curve=[{"step": r["step"], "success": r["success"], "turns": r["turns"]}
                          for r in evals])
    return figures




def summarise(result: dict) -> None:
    """Per method: mean, min and max over the seeds of each figure."""
    by_method = {}
    for key, run in result["runs"].items():
        method = key.split("/")[0]
        by_method.setdefault(method, []).append(run)
    result["summary"] = {}
    for method, runs in sorted(by_method.items()):
        figures = {"seeds": len(runs)}
        for k in ("success", "turns", "off_middle", "kl", "kl_actions", "seconds", "gen_tokens",
                  "t_generate"):
            values = [r[k] for r in runs if k in r]
            if values:
                figures[k] = {"mean": sum(values) / len(values), "min": min(values),
                              "max": max(values)}
        result["summary"][method] = figures


def draw(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs, summary = result["runs"], result["summary"]
    methods = [m for m in ["sft", *METHODS] if m in summary]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    # 1. success and turns per method, the seeds' range as error bars
    ax = axes[0]
    for i, m in enumerate(methods):
        s, t = summary[m]["success"], summary[m]["turns"]
        ax.errorbar(t["mean"], s["mean"], xerr=[[t["mean"] - t["min"]], [t["max"] - t["mean"]]],
                    yerr=[[s["mean"] - s["min"]], [s["max"] - s["mean"]]], fmt="o", capsize=3,
                    label=m, color=COLOURS[m])
    ax.axvline(optimal_turns(), color="gray", linestyle="--", linewidth=1)
    ax.axvline(teacher_turns(), color="gray", linestyle=":", linewidth=1)
    ax.text(optimal_turns(), ax.get_ylim()[0], " binary search", fontsize=7, rotation=90,
            va="bottom")
    ax.text(teacher_turns(), ax.get_ylim()[0], " teacher", fontsize=7, rotation=90, va="bottom")
    ax.set_xlabel("mean turns (held-out episodes)")
    ax.set_ylabel("success within 6 guesses")
    ax.set_title("each method, 3 seeds (range)", fontsize=10)
    ax.legend(fontsize=7)
    # 2. where the guesses fall, SFT against GRPO (all seeds together)
    ax = axes[1]
    for m in ("sft", "grpo"):
        hists = [r["where"] for k, r in runs.items() if k.startswith(m + "/")]
        if hists:
            mean = [sum(h[i] for h in hists) / len(hists) for i in range(BINS)]
            ax.bar([(i + 0.5) / BINS for i in range(BINS)], mean, width=1 / BINS, alpha=0.5,
                   label=m, color=COLOURS[m])
    ax.set_xlabel("where a guess falls in the numbers still possible (0.5 = the middle)")
    ax.set_ylabel("share of guesses")
    ax.set_title("the strategy: before and after RL", fontsize=10)
    ax.legend(fontsize=7)
    # 3. held-out turns along the runs (mean over seeds)
    ax = axes[2]
    for m in METHODS:
        curves = [r["curve"] for k, r in runs.items() if k.startswith(m + "/")]
        if curves:
            steps = [p["step"] for p in curves[0]]
            ax.plot(steps, [sum(c[i]["turns"] for c in curves) / len(curves)
                            for i in range(len(steps))], marker="o", markersize=3, label=m,
                    color=COLOURS[m])
    ax.axhline(optimal_turns(), color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean turns (eval)")
    ax.set_title("turns along training (mean of seeds)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--iters", type=int, default=400, help="RL iterations of every method")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_multiturn"))
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--draw_only", action="store_true")
    ap.add_argument("--actor_lr", type=float, default=-1.0,
                    help="the actor's learning rate (-1: train_ppo.py's default for --env)")
    ap.add_argument("--results", default=RESULTS, help="the JSON to write (its picture beside it)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--options", default="", help="more train_ppo.py flags for a variant of "
                    "the methods, as --options=\"--kl_coef 0.2\"; its runs are keyed and summed up "
                    "apart: METHOD[FLAG=VALUE,...]/SEED")
    args = ap.parse_args()
    tag = results_file.variant_tag(args.options)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = results_file.load(args.results)
    result.update(optimum_turns=optimal_turns(), teacher_turns=teacher_turns(),
                  teacher_success=teacher_success(), held_out_episodes=HELD_OUT,
                  rl_iters=args.iters, actor_lr=resolve_auto_options(
                      train_ppo.Config(env="guess", reward="env", actor_lr=args.actor_lr)).actor_lr)
    if not args.draw_only:
        for seed in args.seeds:
            sft = os.path.join(args.work, f"seed{seed}", "sft")
            key = f"sft/{seed}"
            if args.rerun or key not in result["runs"] or not os.path.exists(os.path.join(sft, "ckpt.pt")):
                result["runs"][key] = run_sft(seed, sft)
                results_file.save(args.results, result)
            for method in args.methods:
                key = f"{method}{tag}/{seed}"
                if key in result["runs"] and not args.rerun:
                    continue
                folder = method + "".join(c if c.isalnum() or c in "._=" else "_" for c in tag)
                out = os.path.join(args.work, f"seed{seed}", folder)
                result["runs"][key] = run_rl(seed, sft, out, {**METHODS[method], **flags(args.options)},
                                             args.iters, args.actor_lr)
                summarise(result)
                results_file.save(args.results, result)
    summarise(result)
    results_file.save(args.results, result)
    draw(result, args.results.replace(".json", ".png"))
    for method, s in result["summary"].items():
        print(f"{method:14s} " + ", ".join(
            f"{k} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]" for k, v in s.items()
            if isinstance(v, dict)))


if __name__ == "__main__":
    main()
