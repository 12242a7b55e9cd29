"""A user's own games at the defaults: do GRPO and PPO learn them, in every seed, at both rates?

    python bench/user_games.py --game duel                  # 2 methods x 2 rates x 3 seeds
    python bench/user_games.py --game corridor --seeds 0 --methods grpo --rates 1e-4
    python bench/user_games.py --game duel --summary_only   # the table from the JSON
    python bench/user_games.py --game corridor --methods grpo --options="--kl_coef 0.2"  # a variant

The games are the two of examples/ (duel_env.py: take one or two stones against a random
opponent; corridor_env.py: walk to the door): in both, two words are the only legal answers,
any other (the empty one included) loses the episode at once, the teacher plays legal moves
at random, and the reward is 1 for a win, else 0, once at the end. As a user runs them: the
teacher's 20,000 episodes as JSONL, `train_sft.py --data ... --env FILE:CLASS
--max_new_tokens 3` (one SFT policy per game, seed 1337, train_sft.py's default), then for each
method, rate and seed `train_ppo.py --env FILE:CLASS --algo METHOD --max_new_tokens 3
--max_iters 300 --actor_lr RATE --seed SEED`, every other option at its default.

Per run it records the held-out win rate at every eval (200 episodes, seeds 0..199; step 0 is
the SFT policy), the final one, the largest `kl`, the iterations the run was `stuck` (no
reward signal while below its SFT level: run/watch.py), the seconds, and the date and
commit it ran at. A run has collapsed when its final held-out win rate is below its SFT policy's;
it dipped when one of its evals was (and came back when it dipped but did not end below). Perfect play wins every
episode of both games (the optimum is 1.0); the target is a final win rate of at least 0.90
in every run.

Each run is saved to bench/results/user_games_GAME.json as it ends; a run already there is not
run again (--rerun to redo), so an interrupted bench goes on where it stopped.
"""
from __future__ import annotations

import argparse
import importlib.util
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
from mingpt_rlhf.machinery.cli import parse_config  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402

GAMES = {"duel": ("duel_env.py", "Duel"), "corridor": ("corridor_env.py", "Corridor")}
TURN_TOKENS = 3      # a move is one word and EOS; one token to spare
SFT_SEED = 1337      # train_sft.py's default
TARGET = 0.90        # of the optimum, 1.0: perfect play wins every episode of both games


def game_module(game: str):
    path = os.path.join(ROOT, "examples", GAMES[game][0])
    spec = importlib.util.spec_from_file_location(GAMES[game][0][:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, f"{path}:{GAMES[game][1]}"


def sft_of(game: str, work: str) -> str:
    """The game's SFT policy in `work` (trained there on the teacher's episodes if missing)."""
    module, env = game_module(game)
    sft = os.path.join(work, "sft")
    if not os.path.exists(os.path.join(sft, "ckpt.pt")):
        os.makedirs(work, exist_ok=True)
        demos = os.path.join(work, "demos.jsonl")
        module.write_demonstrations(demos)
        train_sft.main(train_sft.Config(out_dir=sft, data=demos, env=env, seed=SFT_SEED,
                                        max_new_tokens=TURN_TOKENS))
    return sft


def run_rl(game: str, method: str, rate: float, seed: int, sft: str, out: str,
           iters: int, options: list[str] = ()) -> dict:
    """One RL run as train_ppo.py's command line would start it; `options` are more of its
    flags (["--kl_coef", "0.2"]), for a variant of the defaults."""
    _, env = game_module(game)
    start = time.time()
    argv = ["--out_dir", out, "--sft_dir", sft, "--env", env, "--algo", method,
            "--seed", str(seed), "--max_new_tokens", str(TURN_TOKENS), "--max_iters", str(iters),
            "--actor_lr", str(rate), *options]
    train_ppo.main(parse_config(train_ppo.Config, argv))
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    train = [r for r in rows if "pg_loss" in r]
    evals = [(r["step"], r["win"]) for r in rows if r.get("split") == "eval"]
    return {"seconds": round(time.time() - start, 1), "measured": results_file.measured(ROOT),
            "ran_with": results_file.ran_with(out), "sft_win": evals[0][1],
            "win": evals[-1][1], "best_win": max(w for _, w in evals), "evals": evals,
            "max_kl": max(r["kl"] for r in train),
            "stuck_iterations": rows[-1].get("stuck_iterations", 0),
            "collapsed": evals[-1][1] < evals[0][1]}


def dipped(run: dict) -> bool:
    """Whether a run's held-out win rate fell below its SFT policy's at any eval."""
    return any(win < run["sft_win"] for _, win in run["evals"][1:])


def summary(result: dict) -> dict:
    """Per method and rate: the final win rate of each seed, their least, whether every seed
    met the target and none collapsed (ended below its SFT policy); how many runs dipped below
    their SFT policy at some eval, and how many of those came back (ended at or above it); each
    seed's lowest held-out win rate after its first eval."""
    rows = {}
    for key, run in sorted(result["runs"].items()):
        row = key.rsplit("/", 1)[0]
        rows.setdefault(row, []).append(run)
    return {row: {"wins": [r["win"] for r in runs], "least": min(r["win"] for r in runs),
                  "sft_win": runs[0]["sft_win"], "collapsed": sum(r["collapsed"] for r in runs),
                  "dipped": sum(dipped(r) for r in runs),
                  "came_back": sum(dipped(r) and not r["collapsed"] for r in runs),
                  "lowest": [min(win for _, win in r["evals"][1:]) for r in runs],
                  "stuck_iterations": [r["stuck_iterations"] for r in runs],
                  "met": all(r["win"] >= TARGET for r in runs) and not any(r["collapsed"] for r in runs)}
            for row, runs in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--game", choices=list(GAMES), required=True)
    ap.add_argument("--methods", nargs="+", default=["grpo", "ppo"], choices=["grpo", "ppo", "rloo"])
    ap.add_argument("--rates", type=float, nargs="+", default=[5e-5, 1e-4], help="--actor_lr values")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iters", type=int, default=300, help="RL iterations of every run")
    ap.add_argument("--work", default="", help="folder of the runs (default: out/bench_GAME)")
    ap.add_argument("--results", default="", help="default: bench/results/user_games_GAME.json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--options", default="", help="more train_ppo.py flags for a variant of "
                    "the defaults, as --options=\"--kl_coef 0.2\"; its runs are keyed and summed up "
                    "apart: METHOD[FLAG=VALUE,...]/RATE/SEED")
    ap.add_argument("--rerun", action="store_true", help="run again what the JSON already has")
    ap.add_argument("--summary_only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or os.path.join(ROOT, "out", f"bench_{args.game}")
    path = args.results or os.path.join(ROOT, "bench", "results", f"user_games_{args.game}.json")
    result = results_file.load(path)
    result.update(game=args.game, iters=args.iters, target=TARGET)
    if not args.summary_only:
        sft = sft_of(args.game, work)
        for method in args.methods:
            for rate in args.rates:
                for seed in args.seeds:
                    key = f"{method}{results_file.variant_tag(args.options)}/{rate:g}/{seed}"
                    if key in result["runs"] and not args.rerun:
                        continue
                    tag = "".join(c if c.isalnum() or c in "._" else "_" for c in args.options).strip("_")
                    out = os.path.join(work, f"{method}{'_' + tag if tag else ''}_{rate:g}_seed{seed}")
                    result["runs"][key] = run_rl(args.game, method, rate, seed, sft, out,
                                                 args.iters, args.options.split())
                    result["summary"] = summary(result)
                    results_file.save(path, result)
    result["summary"] = summary(result)
    results_file.save(path, result)
    for row, s in result["summary"].items():
        print(f"{args.game} {row:24s} SFT {s['sft_win']:.3f} -> wins {s['wins']} least "
              f"{s['least']:.3f} collapsed {s['collapsed']} dipped {s['dipped']} came back "
              f"{s['came_back']} stuck {s['stuck_iterations']}"
              f"{'  target met' if s['met'] else ''}")


if __name__ == "__main__":
    main()
