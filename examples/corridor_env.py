"""A one-player game with the duel game's traps: walk a corridor to the goal in few steps.

    python examples/corridor_env.py out/corridor/demos.jsonl     # the teacher's demonstrations
    python train_sft.py --data out/corridor/demos.jsonl --env examples/corridor_env.py:Corridor \\
        --max_new_tokens 3 --out_dir out/corridor/sft
    python train_ppo.py --env examples/corridor_env.py:Corridor --algo grpo --max_new_tokens 3 \\
        --max_iters 300 --sft_dir out/corridor/sft --out_dir out/corridor/grpo

    opening:  "a corridor of 9 cells . you are at 4 , the door is at 0 . left or right :"
    policy:   "left"       env: "you are at 3"
    policy:   "right"      env: "you are at 4"
    ...                    -> at the door within 6 moves: reward 1, the episode ends

The rules. Cells 0 to 8; the door is at one end (0 or 8) and the walker 1 to 6 cells from
it, both drawn from the episode's seed. Each turn the policy
answers exactly "left" or "right" and moves one cell (a move into the end wall without the
door keeps it where it is); any other answer, the empty one included, is illegal and loses at
once. Reaching the door within 6 moves wins (reward 1); otherwise the episode ends after the
sixth move with reward 0. The reward is sparse: 1 on the winning move, 0 everywhere else.

What it shares with examples/duel_env.py, and what differs:
- **Perfect play wins every episode**: the walker starts 1 to 6 cells from the door, and the
  straight walk towards it arrives within the 6 moves.
- **A weak teacher**: the demonstrations move left or right at random; they win
  `teacher_win()` = 0.255 of the episodes, exactly, and SFT learns only to answer legally.
- **Losing is easy**: two words are legal, every other answer (the empty one: EOS as a turn's
  first token) ends the episode at once with reward 0.
- Unlike the duel, nothing in the environment is random after the opening: a policy that has
  become deterministic plays every episode of a GRPO group the same way.
"""
from __future__ import annotations

import json
import random
import sys
from functools import lru_cache

CELLS = 9                         # 0 .. 8; the door is at 0 or 8
MOVES = 6                         # a walk longer than this loses
WORDS = {"left": -1, "right": +1}
TRAINING_SEEDS_FROM = 1_000_000   # as the duel: seeds below are held out for evaluation


def start_of(seed: int) -> tuple[int, int]:
    """(walker, door) of the episode of `seed`: the door at an end, the walker 1 to MOVES
    cells from it."""
    rng = random.Random(f"corridor/{seed}")
    door = rng.choice((0, CELLS - 1))
    walker = door + rng.randint(1, MOVES) * (1 if door == 0 else -1)
    return walker, door


class Corridor:
    """The game, in the environment interface of docs/multiturn.md."""

    best_return = 1.0  # a win: the most an episode can return (the stuck-run warning reads it)

    def reset(self, seed: int) -> str:
        self.walker, self.door = start_of(seed)
        self.moves = 0
        return (f"a corridor of {CELLS} cells . you are at {self.walker} , the door is at "
                f"{self.door} . left or right :")

    def step(self, action: str) -> tuple[str, float, bool]:
        move = WORDS.get(action.strip())
        if move is None:
            return "illegal , you lose", 0.0, True
        self.walker = min(max(self.walker + move, 0), CELLS - 1)
        self.moves += 1
        if self.walker == self.door:
            return "you are out", 1.0, True
        if self.moves == MOVES:
            return "too late , you lose", 0.0, True
        return f"you are at {self.walker}", 0.0, False

    @classmethod
    def figures(cls, transcripts, returns: list[float]) -> dict:
        """win: the share of episodes won; with the transcripts, illegal: the share lost by an
        illegal answer, and empty: the share of policy turns that were empty."""
        out = {"win": sum(r > 0 for r in returns) / max(1, len(returns))}
        if transcripts is not None:
            policy_turns = [text for t in transcripts for role, text in t if role == "policy"]
            out["illegal"] = sum(any(role == "policy" and text.strip() not in WORDS
                                     for role, text in t) for t in transcripts) / max(1, len(transcripts))
            out["empty"] = sum(not text.strip() for text in policy_turns) / max(1, len(policy_turns))
        return out


@lru_cache(maxsize=None)
def teacher_win(walker: int | None = None, door: int | None = None, left: int = MOVES) -> float:
    """The random teacher's exact chance to reach the door within `left` moves (None: the mean
    over every start the seeds draw, each as likely)."""
    if walker is None:
        starts = [(d + k * (1 if d == 0 else -1), d) for d in (0, CELLS - 1)
                  for k in range(1, MOVES + 1)]
        return sum(teacher_win(w, d) for w, d in starts) / len(starts)
    if walker == door:
        return 1.0
    if left == 0:
        return 0.0
    return sum(teacher_win(min(max(walker + m, 0), CELLS - 1), door, left - 1)
               for m in WORDS.values()) / 2


def teacher_episode(seed: int) -> list[tuple[str, str]]:
    """A demonstration: the teacher's episode of `seed`, each move left or right at random; the
    verdict left out, as nothing follows it."""
    env, rng = Corridor(), random.Random(f"corridor-teacher/{seed}")
    turns = [("env", env.reset(seed))]
    while True:
        move = rng.choice(sorted(WORDS))
        turns.append(("policy", move))
        reply, _, done = env.step(move)
        if done:
            return turns
        turns.append(("env", reply))


def write_demonstrations(path: str, episodes: int = 20000, seed: int = 0) -> None:
    """The teacher's episodes as JSONL lines {"turns": [{"role", "text"}, ...]}, seeds of a
    million and more (no held-out episode among them)."""
    rng = random.Random(f"corridor-demos/{seed}")
    with open(path, "w") as f:
        for _ in range(episodes):
            turns = teacher_episode(rng.randrange(TRAINING_SEEDS_FROM, 2 ** 31 - 1))
            f.write(json.dumps({"turns": [{"role": r, "text": t} for r, t in turns]}) + "\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python examples/corridor_env.py OUT.jsonl [EPISODES]")
    write_demonstrations(sys.argv[1], *(int(a) for a in sys.argv[2:]))
    print(f"wrote {sys.argv[1]}; the teacher wins {teacher_win():.3f} of the episodes")
