"""A two-player game as a user would write it: take one or two stones, the last stone wins.

    python examples/duel_env.py out/duel/demos.jsonl        # the teacher's demonstrations
    python train_sft.py --data out/duel/demos.jsonl --env examples/duel_env.py:Duel \\
        --max_new_tokens 3 --out_dir out/duel/sft
    python train_ppo.py --env examples/duel_env.py:Duel --algo grpo --max_new_tokens 3 \\
        --max_iters 300 --sft_dir out/duel/sft --out_dir out/duel/grpo     (docs/multiturn.md)

    opening:  "7 stones . take one or two , the last stone wins :"
    policy:   "one"        env: "i take two : 4 left"
    policy:   "one"        env: "i take one : 2 left"
    policy:   "two"        -> the policy took the last stone: reward 1, the episode ends

The rules. A pile of stones (4, 5, 7, 8, 10 or 11, drawn from the episode's seed) lies between
the policy and an opponent. The policy moves first; each move takes one or two stones, and
whoever takes the last stone wins. The policy answers with exactly one of two words, "one" or
"two"; any other answer (an empty one included), or "two" when one stone is left, is illegal:
the policy loses at once. The opponent takes one or two stones at random (a legal move,
drawn from the episode's seed). The reward is 1 for a win, else 0, on the last turn.

Why it has the properties the study needs:
- **Perfect play wins every opening.** No pile is a multiple of 3, so the policy can always
  leave a multiple of 3 (take `pile % 3`); whatever the opponent then takes, the pile is not a
  multiple of 3 again, and the policy ends by taking the last stone. It wins whatever the
  opponent does (`perfect_move`; a test plays every opening against every opponent).
- **The teacher is well below it.** The demonstrations come from a teacher that takes one or
  two stones at random among its legal moves: it wins `teacher_win()` = 0.542 of the openings,
  exactly (0.516 to 0.625 by pile). SFT learns to play legally, like it; only RL against the
  outcome can learn the rule "leave a multiple of 3".
- **Losing is easy.** Two words are legal, every other token sequence is not, so a policy
  that moves probability onto anything else (the empty answer: EOS as a turn's first token)
  loses every episode at once, and every group of GRPO ties at 0.

Held out: evaluation episodes have the seeds 0, 1, 2, ..., training and the demonstrations
seeds of a million and more, as for the built-in guessing game.
"""
from __future__ import annotations

import json
import random
import sys
from functools import lru_cache

PILES = (4, 5, 7, 8, 10, 11)      # no multiple of 3: the player who moves first can always win
WORDS = {"one": 1, "two": 2}      # the only legal answers
TRAINING_SEEDS_FROM = 1_000_000   # as episodes.HELD_OUT_SEEDS: seeds below are held out


class Duel:
    """The game, in the environment interface of docs/multiturn.md."""

    best_return = 1.0  # a win: the most an episode can return (the stuck-run warning reads it)

    def reset(self, seed: int) -> str:
        rng = random.Random(f"duel/{seed}")
        self.pile = rng.choice(PILES)
        self.opponent = random.Random(f"duel-opponent/{seed}")   # the opponent's moves
        return f"{self.pile} stones . take one or two , the last stone wins :"

    def step(self, action: str) -> tuple[str, float, bool]:
        take = WORDS.get(action.strip())
        if take is None or take > self.pile:
            return "illegal , you lose", 0.0, True
        self.pile -= take
        if self.pile == 0:
            return "you win", 1.0, True
        reply = self.opponent.choice([k for k in (1, 2) if k <= self.pile])
        self.pile -= reply
        word = "one" if reply == 1 else "two"
        if self.pile == 0:
            return f"i take {word} : i win", 0.0, True
        return f"i take {word} : {self.pile} left", 0.0, False

    @classmethod
    def figures(cls, transcripts, returns: list[float]) -> dict:
        """win: the share of episodes won; with the transcripts, illegal: the share lost by an
        illegal answer, and empty: the share of policy turns that were empty."""
        out = {"win": sum(r > 0 for r in returns) / max(1, len(returns))}
        if transcripts is not None:
            policy_turns = [text for t in transcripts for role, text in t if role == "policy"]
            out["illegal"] = sum(illegal_end(t) for t in transcripts) / max(1, len(transcripts))
            out["empty"] = sum(not text.strip() for text in policy_turns) / max(1, len(policy_turns))
        return out


def illegal_end(transcript: list[tuple[str, str]]) -> bool:
    """Whether the episode ended on an illegal answer (its last policy turn is no legal move
    in the pile the environment's last message left)."""
    pile, last = None, None
    for role, text in transcript:
        if role == "env":
            numbers = [int(w) for w in text.split() if w.isdigit()]
            pile = numbers[-1] if numbers else pile
        else:
            last = (WORDS.get(text.strip()), pile)
    return last is not None and (last[0] is None or last[0] > last[1])


def perfect_move(pile: int) -> int:
    """Leave a multiple of 3 when you can (any move when you cannot: you then need luck)."""
    return pile % 3 or 1


@lru_cache(maxsize=None)
def teacher_win(pile: int | None = None, my_turn: bool = True) -> float:
    """The random legal teacher's exact chance to win from `pile` (None: the mean over PILES,
    every pile as likely, 0.542), against the random opponent."""
    if pile is None:
        return sum(teacher_win(p) for p in PILES) / len(PILES)
    moves = [k for k in (1, 2) if k <= pile]
    if my_turn:
        return sum(1.0 if k == pile else teacher_win(pile - k, False) for k in moves) / len(moves)
    return sum(0.0 if k == pile else teacher_win(pile - k, True) for k in moves) / len(moves)


def teacher_episode(seed: int) -> list[tuple[str, str]]:
    """A demonstration: [("env", opening), ("policy", move), ("env", reply), ...] of the
    teacher playing the episode of `seed`, each move drawn at random among the legal ones. The
    last reply (the verdict) is left out: nothing follows it, so a policy never reads it."""
    env, rng = Duel(), random.Random(f"duel-teacher/{seed}")
    turns = [("env", env.reset(seed))]
    while True:
        move = rng.choice([w for w, k in WORDS.items() if k <= env.pile])
        turns.append(("policy", move))
        reply, _, done = env.step(move)
        if done:
            return turns
        turns.append(("env", reply))


def write_demonstrations(path: str, episodes: int = 20000, seed: int = 0) -> None:
    """The teacher's episodes as JSONL lines {"turns": [{"role", "text"}, ...]}, the input of
    `train_sft.py --data PATH --env examples/duel_env.py:Duel`. Their seeds are drawn from a
    million and more, so no held-out opening's episode is among them."""
    rng = random.Random(f"duel-demos/{seed}")
    with open(path, "w") as f:
        for _ in range(episodes):
            turns = teacher_episode(rng.randrange(TRAINING_SEEDS_FROM, 2 ** 31 - 1))
            f.write(json.dumps({"turns": [{"role": r, "text": t} for r, t in turns]}) + "\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python examples/duel_env.py OUT.jsonl [EPISODES]")
    write_demonstrations(sys.argv[1], *(int(a) for a in sys.argv[2:]))
    print(f"wrote {sys.argv[1]}; the teacher wins {teacher_win():.3f} of the openings")
