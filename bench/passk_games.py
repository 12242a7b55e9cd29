"""pass@k on a game: does RL reach fewer openings than the policy it started from?

    python bench/passk_games.py --game corridor out/bench_corridor/sft out/bench_corridor/grpo_5e-05_seed1 ...
    python bench/passk_games.py --game corridor --table        # the table from the JSON

The problems are the game's openings (bench/first_moves.py enumerates them: the corridor's
twelve starts, the duel's six piles, each played from the first seed that draws it, so that
the duel's opponent answers each attempt alike). Each policy (a run folder with its ckpt.pt,
the SFT policy's folder included) plays each opening --n times at temperature 1 with the
game's budget of 3 tokens a turn, and pass@k, the chance that at least one of k attempts wins,
is estimated without bias from the wins (mingpt_rlhf/lab/passk.py) for k = 1, 2, 4, ..., up
to --n, averaged over the openings. Yue et al. (2025) report that RL raises pass@1 while the
model it started from solves more problems at large k; here a policy that walks alike
whatever the door has openings it can hardly ever win, which its random-walking SFT policy
wins with enough attempts (each policy's `start_above_from`: the least k at which the run
keyed "sft" is above it, and `start_above_by`, by how much at most). Written to bench/results/passk_games_GAME.json, keyed by the
folder's name, each as it ends.
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

from first_moves import GAMES, game_class, openings  # noqa: E402
from mingpt_rlhf.lab.passk import pass_at_k_curve  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402
from mingpt_rlhf.methods.episodes import EpisodeSource  # noqa: E402

TURN_TOKENS = 3      # as bench/user_games.py
MAX_TURNS = 8        # train_ppo.py's --max_turns: more than either game lasts


@torch.no_grad()
def wins(folder: str, game: str, n: int, batch_size: int = 256) -> dict:
    """{opening: how many of n attempts the policy in `folder` won}."""
    policy, tokenizer, _ = load_policy(folder, flag="--ckpt_dir")
    env_class = game_class(game)[1]
    source = EpisodeSource(env_class, game, tokenizer, max_turns=MAX_TURNS)
    cfg = argparse.Namespace(max_new_tokens=TURN_TOKENS, temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    counts = {}
    for name, (_, _, _, seed) in openings(game).items():
        won = 0
        for start in range(0, n, batch_size):
            episodes = source.play(policy, [seed] * min(batch_size, n - start), cfg, generator)
            won += int((episodes.returns > 0).sum())
        counts[name] = won
    return counts


def curve(counts: dict, n: int) -> dict:
    ks = [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    return {str(k): round(v, 4) for k, v in pass_at_k_curve([(n, c) for c in counts.values()], ks).items()}


def against_start(result: dict, start: str = "sft") -> None:
    """For each policy, where the policy it started from (the run keyed `start`) is above it:
    `start_above_from`, the least k at which its pass@k is higher (None: at no k), and
    `start_above_by`, the largest margin over the k (0 when never above)."""
    if start not in result["runs"]:
        return
    base = result["runs"][start]["pass_at_k"]
    for run in result["runs"].values():
        gaps = {int(k): base[k] - v for k, v in run["pass_at_k"].items() if k in base}
        above = [k for k, g in sorted(gaps.items()) if g > 0]
        run["start_above_from"] = above[0] if above else None
        run["start_above_by"] = round(max([0.0, *gaps.values()]), 4)


def table(result: dict) -> str:
    ks = ["1", "4", "16", "64", "256", "1024"]
    lines = [f"{'policy':36s} " + " ".join(f"{'@' + k:>7s}" for k in ks) + "  the SFT policy above"]
    for name, run in result["runs"].items():
        above = (f"from k = {run['start_above_from']}, by up to {run['start_above_by']:.3f}"
                 if run.get("start_above_from") else "")
        lines.append(f"{name:36s} " + " ".join(f"{run['pass_at_k'].get(k, float('nan')):7.3f}" for k in ks)
                     + "  " + above)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--game", choices=list(GAMES), required=True)
    ap.add_argument("runs", nargs="*", help="policy folders (an SFT's or an RL run's), each with its ckpt.pt")
    ap.add_argument("--n", type=int, default=1024, help="attempts per opening")
    ap.add_argument("--results", default="", help="default: bench/results/passk_games_GAME.json")
    ap.add_argument("--table", action="store_true", help="print the table from the JSON")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.results or os.path.join(ROOT, "bench", "results", f"passk_games_{args.game}.json")
    result = results_file.load(path)
    result.update(game=args.game, n=args.n)
    for folder in args.runs:
        name = os.path.basename(os.path.normpath(folder))
        counts = wins(folder, args.game, args.n)
        result["runs"][name] = {"wins": counts, "pass_at_k": curve(counts, args.n),
                                "unreached": sum(c == 0 for c in counts.values()),
                                "measured": results_file.measured(ROOT)}
        results_file.save(path, result)
    against_start(result)
    results_file.save(path, result)
    print(table(result))


if __name__ == "__main__":
    main()
