"""Does a game's policy play the right first move in every opening? Exactly, from its checkpoint.

    python bench/first_moves.py --game duel out/bench_duel/ppo_0.0001_seed0 ...       # run folders
    python bench/first_moves.py --game corridor out/bench_corridor/grpo_5e-05_seed1 ...

The games are the two of examples/ that bench/user_games.py trains on. Every opening the seeds
can draw is enumerated (the duel: a pile of 4, 5, 7, 8, 10 or 11 stones; the corridor: the
door at 0 or 8 and the walker 1 to 6 cells from it), and for each the policy of the run's
final checkpoint gives its probability of the right first move, exactly: the softmax of the
token after the opening, each move's word being one token. The right move: in the duel the one
that leaves a multiple of 3 (perfect play), in the corridor the step towards the door.

Per run folder: `p_right` by opening; `right`, their mean (the seeds draw each opening about
as often); `least` and the opening it is at; `sure_wrong`, the openings where the right move
has probability below 0.05 (the policy is sure of the other move, and a move it does not sample
gets no credit, so it stays there); `wrong_first_wins` by opening, the exact chance to win
after the wrong first move with perfect play after it (the right move wins surely: a small
gap is a weak signal to learn the right one from; the duel's opponent plays at random, so a
wrong move there often still wins); for the corridor `left_door_0` and `left_door_8`, the
probability of "left" averaged over the openings of each door (a policy that reads the door has
them near 1 and 0, one that walks alike whatever the door has them close); and over the run's
last 50 iterations its mean `entropy` and `zero_groups` (metrics.jsonl). Written to
bench/results/first_moves_GAME.json, keyed by the folder's name.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

from mingpt_rlhf.stages import load_policy  # noqa: E402
from user_games import GAMES as USER_GAMES, game_module  # noqa: E402

SURE = 0.05          # below this, the right move is one the policy no longer samples
SEEDS = range(1000)  # enough seeds to draw every opening of both games


def duel_opening(env, module) -> tuple[str, str, float]:
    """(the opening's name, the right move's word, the chance to win after the wrong first
    move with perfect play after it, against the random opponent) of a Duel after reset."""
    right = module.perfect_move(env.pile)
    return f"pile {env.pile}", {1: "one", 2: "two"}[right], duel_win_after(env.pile - (3 - right))


def duel_win_after(pile: int) -> float:
    """The chance to win when `pile` stones are left for the random opponent, playing
    perfectly after (the best move each turn, exactly)."""
    if pile == 0:
        return 1.0
    replies = [k for k in (1, 2) if k <= pile]
    return sum(0.0 if k == pile else max(duel_win_after(pile - k - m) for m in (1, 2)
                                         if m <= pile - k)
               for k in replies) / len(replies)


def corridor_opening(env, module) -> tuple[str, str, float]:
    """The same for a Corridor: after a step away from the door, the walk back straight wins
    only if the door is still within the moves left."""
    away = abs(env.walker - env.door) + 1
    return (f"door {env.door} at {env.walker}", "left" if env.door < env.walker else "right",
            float(away <= module.MOVES - 1))


# per game: how an opening is named and which first move is right, and the two moves' words
GAMES = {"duel": (duel_opening, ("one", "two")), "corridor": (corridor_opening, ("left", "right"))}


def game_class(game: str):
    """(the game's module, its environment class), loaded as bench/user_games.py loads them."""
    module = game_module(game)[0]
    return module, getattr(module, USER_GAMES[game][1])


def openings(game: str) -> dict:
    """{name: (opening text, right word, the chance to win after the wrong first move, the
    first seed that draws it)} of every opening the seeds draw."""
    module, env_class = game_class(game)
    describe = GAMES[game][0]
    found = {}
    for seed in SEEDS:
        env = env_class()
        text = env.reset(seed)
        name, right, wrong_wins = describe(env, module)
        found.setdefault(name, (text, right, wrong_wins, seed))
    return dict(sorted(found.items()))


@torch.no_grad()
def move_probabilities(policy, tokenizer, text: str, words) -> dict:
    """{word: probability of the word as the next token after `text`} under `policy`."""
    ids = []
    for w in words:
        encoded = tokenizer.encode(w)
        if len(encoded) != 1:
            raise SystemExit(f"the move {w!r} is {len(encoded)} tokens for this tokenizer; "
                             f"this bench reads one-token moves")
        ids.append(encoded[0])
    x = torch.tensor([tokenizer.encode(text)])
    hidden = policy.trunk(x, torch.ones_like(x))[:, -1]
    logits = policy.logits(hidden).float()[0]
    if tokenizer.pad_id != tokenizer.eos_id:   # a PAD of its own is never sampled
        logits[tokenizer.pad_id] = -float("inf")
    p = torch.softmax(logits, -1)
    return {w: p[i].item() for w, i in zip(words, ids)}


def measure(game: str, folder: str) -> dict:
    policy, tokenizer, _ = load_policy(folder, flag="--ckpt_dir")
    words = GAMES[game][1]
    p_right, wrong_wins, left = {}, {}, {}
    for name, (text, right, wins, _) in openings(game).items():
        p = move_probabilities(policy, tokenizer, text, words)
        p_right[name], wrong_wins[name] = round(p[right], 4), round(wins, 4)
        if game == "corridor":
            left.setdefault(name.split()[1], []).append(p["left"])
    least = min(p_right, key=p_right.get)
    row = {"p_right": p_right, "wrong_first_wins": wrong_wins,
           "right": round(sum(p_right.values()) / len(p_right), 4),
           "least": p_right[least], "least_at": least,
           "least_wrong_first_wins": wrong_wins[least],
           "sure_wrong": [name for name, p in p_right.items() if p < SURE]}
    row.update({f"left_door_{door}": round(sum(v) / len(v), 4) for door, v in sorted(left.items())})
    metrics = os.path.join(folder, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics, encoding="utf-8") as f:
            train = [r for r in map(json.loads, f) if "pg_loss" in r][-50:]
        row.update({k: round(sum(r[k] for r in train) / len(train), 3)
                    for k in ("entropy", "zero_groups") if train and k in train[0]})
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--game", choices=list(GAMES), required=True)
    ap.add_argument("runs", nargs="+", help="run folders, each with its ckpt.pt (and metrics.jsonl)")
    ap.add_argument("--results", default="", help="default: bench/results/first_moves_GAME.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = args.results or os.path.join(ROOT, "bench", "results", f"first_moves_{args.game}.json")
    result = results_file.load(path)
    result["game"] = args.game
    for folder in args.runs:
        name = os.path.basename(os.path.normpath(folder))
        result["runs"][name] = row = measure(args.game, folder)
        results_file.save(path, result)
        print(f"{name:36s} right {row['right']:.3f}, least {row['least']:.3f} ({row['least_at']}), "
              f"sure wrong: {', '.join(row['sure_wrong']) or 'none'}"
              + (f"; left by door {row['left_door_0']:.3f} / {row['left_door_8']:.3f}"
                 if "left_door_0" in row else ""))


if __name__ == "__main__":
    main()
