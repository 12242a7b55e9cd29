"""Real runs' per-iteration figures for the stuck-run watch's tests (tests/test_stuck.py).

    python bench/stuck_fixtures.py                 # trains what it needs under --work, ~40 min
    python bench/stuck_fixtures.py --only tied     # one of: collapsed, tied, converged

Three runs, each kept as the figures the watch reads (run/watch.py: score, zero_groups,
entropy, kl, minibatch_steps, early_stop_kl, eos_rate, and what the run itself logged as
`stuck`), one JSON line per iteration, in a file named after the run in FIXTURES:

- collapsed: the corridor game of examples/ at the `--env` defaults (GRPO, --actor_lr 1e-4,
  seed 0, 300 iterations: the learning rate decays over them, so a shorter run is another
  run; one of the six seeds docs/multiturn.md reports): at its 21st iteration it moved onto
  the empty answer, and every group lost and tied for tens of iterations, far below the SFT
  policy's level, before it came back;
- tied: the duel game with --max_turns 1: no pile can be taken in one move, so every episode
  of every group ends unwon from the first iteration (and the duel says 1.0 is the most an
  episode returns);
- converged: GRPO on the built-in guessing game at its --env defaults for 400 iterations: its
  batch reward rises from the SFT level towards a plateau and wanders with the secrets drawn
  (it keeps sampling, about 0.74 nats a token at the end, so its groups do not tie).

The first line of each file is {"run": ..., "command": ..., "measured": ...}. The SFT policies
are trained as bench/user_games.py and bench/multiturn.py train theirs.
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

import train_ppo  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.machinery.cli import parse_config  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from user_games import GAMES, TURN_TOKENS, sft_of  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "stuck")
KEPT = ("step", "score", "zero_groups", "entropy", "kl", "minibatch_steps", "early_stop_kl",
        "eos_rate", "stuck")


def game_run(game: str, out: str, work: str, iters: int, extra: list[str]) -> list[str]:
    sft = sft_of(game, os.path.join(work, f"bench_{game}"))
    env = os.path.join(ROOT, "examples", GAMES[game][0]) + ":" + GAMES[game][1]
    return ["--out_dir", out, "--sft_dir", sft, "--env", env, "--algo", "grpo", "--seed", "0",
            "--max_new_tokens", str(TURN_TOKENS), "--max_iters", str(iters), *extra]


def guess_run(out: str, work: str, iters: int) -> list[str]:
    sft = os.path.join(work, "guess_sft")
    if not os.path.exists(os.path.join(sft, "ckpt.pt")):
        train_sft.main(train_sft.Config(out_dir=sft, env="guess", seed=0, max_new_tokens=TURN_TOKENS))
    return ["--out_dir", out, "--sft_dir", sft, "--env", "guess", "--algo", "grpo", "--seed", "0",
            "--max_new_tokens", str(TURN_TOKENS), "--max_iters", str(iters)]


RUNS = {
    "collapsed": lambda out, work: game_run("corridor", out, work, 300, ["--actor_lr", "1e-4"]),
    "tied": lambda out, work: game_run("duel", out, work, 15, ["--max_turns", "1"]),
    "converged": lambda out, work: guess_run(out, work, 400),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_stuck"))
    ap.add_argument("--only", nargs="+", choices=list(RUNS), default=list(RUNS))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(FIXTURES, exist_ok=True)
    for name in args.only:
        out = os.path.join(args.work, name)
        argv = RUNS[name](out, args.work)
        train_ppo.main(parse_config(train_ppo.Config, argv))
        rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl"))
                if "minibatch_steps" in r and "split" not in r and not r.get("final")]
        head = {"run": name, "command": "python train_ppo.py " + " ".join(argv).replace(ROOT + "/", ""),
                "measured": results_file.measured(ROOT)}
        path = os.path.join(FIXTURES, f"{name}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(line) + "\n"
                         for line in [head] + [{k: r[k] for k in KEPT if k in r} for r in rows])
        print(f"wrote {path}: {len(rows)} iterations")


if __name__ == "__main__":
    main()
