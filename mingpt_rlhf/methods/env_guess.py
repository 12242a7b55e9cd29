"""A built-in environment whose optimum is known: guess the number, told "higher" or "lower".

    opening:  "guess a number from 1 to 15 :"
    policy:   "8 <eos>"      env: "lower"
    policy:   "3 <eos>"      env: "higher"
    policy:   "6 <eos>"      env: "higher"
    policy:   "7 <eos>"      -> correct: reward 1, the episode ends

The secret is drawn from the episode's seed (1..N, N = 15). Binary search (guess the middle
of the numbers still possible; each reply halves them) always wins within ceil(log2(N + 1)) =
4 guesses, and needs `optimal_turns()` = 49 / 15 = 3.27 on average, the fewest any strategy
can. The game needs the history of the episode: which numbers are still possible depends on
every earlier guess and reply.

The player has `TURNS` = 6 guesses. Each wrong guess costs 0.1 (a per-turn reward, on that
turn's last token) and finding the secret earns 1, so the return is 1 - 0.1 x (wrong guesses)
for a win and -0.6 for a loss: the fewer the guesses, the higher it is. A guess that is not
one number from 1 to N gets the reply "invalid" and costs its turn.

The teacher of the demonstrations (`teacher_episode`) plays legally but weakly: each guess is
drawn uniformly among the numbers still possible. It needs 4.08 guesses on average, and wins
within 6 guesses 92 % of the time (`teacher_success()`, `teacher_turns()`, computed exactly).
SFT learns to play legally, like the teacher; only RL against the outcome can find that the
middle is the best guess.

Held out: the trainer gives evaluation episodes the seeds 0, 1, 2, ... and training episodes
seeds of a million and more (methods/episodes.py), so no evaluation episode is ever trained on. There
are only 15 secrets, so every secret occurs in training too: what is held out is the episode,
and what RL must learn is a strategy for every set of numbers still possible.

`where_in_interval` turns a transcript into the picture of the strategy: where each guess falls
inside the numbers still possible (0 = the lowest, 1 = the highest, 0.5 = binary search).

Try it:  python -c "from mingpt_rlhf.methods.env_guess import *; print(teacher_episode(0))"
         python sample.py --ckpt_dir out/guess/grpo --env guess    (docs/multiturn.md)
"""
from __future__ import annotations

import random
from functools import lru_cache

from ..tokenizer import WordTokenizer


# the seeds of training episodes start here, as episodes.HELD_OUT_SEEDS says (a test checks they
# agree; this module does not import methods/episodes.py, which imports it)
TRAINING_SEEDS_FROM = 1_000_000


class GuessNumber:
    """The guessing game, in the environment interface of methods/episodes.py."""

    N = 15
    TURNS = 6                       # guesses allowed; binary search needs at most 4
    COST = 0.1                      # the reward of a wrong guess is -COST
    best_return = 1.0               # found at the first guess: the most an episode returns

    def reset(self, seed: int) -> str:
        self.secret = random.Random(f"guess/{seed}").randint(1, self.N)
        self.turns = 0
        return f"guess a number from 1 to {self.N} :"

    def step(self, action: str) -> tuple[str, float, bool]:
        self.turns += 1
        guess = parse_guess(action, self.N)
        if guess == self.secret:
            return "correct", 1.0, True
        if self.turns >= self.TURNS:
            return f"no , it was {self.secret}", -self.COST, True
        if guess is None:
            return "invalid", -self.COST, False
        return ("higher" if guess < self.secret else "lower"), -self.COST, False

    @classmethod
    def figures(cls, transcripts, returns: list[float]) -> dict:
        """success: the share of episodes won (a win's return is 1 - 0.1 x wrong guesses > 0, a
        loss's -0.6); with the
        transcripts, off_middle: how far the legal guesses fall from the middle of the numbers
        still possible, on average (0 = binary search, 0.25 = the uniform teacher, 0.5 = always
        an end)."""
        out = {"success": sum(r > 0 for r in returns) / max(1, len(returns))}
        if transcripts is not None:
            where = [w for t in transcripts for w in where_in_interval(t, cls.N)]
            out["off_middle"] = sum(abs(w - 0.5) for w in where) / max(1, len(where))
        return out

    @classmethod
    def teacher_episodes(cls, split: str, seed: int) -> list:
        """The teacher's demonstrations (data.Transcript): 20,000 training episodes drawn
        from `seed` (seeds of a million and more, like RL's training episodes), or the 500
        held-out episodes of seeds 0..499 (for SFT's eval loss)."""
        from ..data import Transcript
        if split == "eval":
            seeds = range(500)
        else:
            rng = random.Random(f"guess-teacher/{seed}")
            seeds = [rng.randrange(TRAINING_SEEDS_FROM, 2 ** 31 - 1) for _ in range(20000)]
        return [Transcript(teacher_episode(s, cls)) for s in seeds]

    @classmethod
    def vocabulary(cls) -> list[str]:
        """Every word of the game (the openings, guesses and replies)."""
        return (["guess", "a", "number", "from", "to", ":", "higher", "lower", "invalid",
                 "correct", "no", ",", "it", "was"] + [str(n) for n in range(1, cls.N + 1)])

    @classmethod
    def tokenizer(cls) -> WordTokenizer:
        return WordTokenizer(cls.vocabulary())


def parse_guess(action: str, n: int) -> int | None:
    """The number guessed, or None unless `action` is exactly one number from 1 to n."""
    words = action.replace("<eos>", " ").split()
    if len(words) != 1 or not words[0].isdigit():
        return None
    guess = int(words[0])
    return guess if 1 <= guess <= n else None


def teacher_episode(seed: int, env_class=GuessNumber) -> list[tuple[str, str]]:
    """A demonstration: the transcript [("env", opening), ("policy", guess), ("env", reply),
    ...] of the teacher playing the episode of `seed`, each guess drawn uniformly among the
    numbers still possible. The last reply (the game's verdict) is left out: nothing follows
    it, so a policy never reads it."""
    env, rng = env_class(), random.Random(f"teacher/{seed}")
    turns = [("env", env.reset(seed))]
    lo, hi = 1, env.N
    while True:
        guess = rng.randint(lo, hi)
        turns.append(("policy", str(guess)))
        reply, _, done = env.step(str(guess))
        if done:
            return turns
        turns.append(("env", reply))
        lo, hi = (guess + 1, hi) if reply == "higher" else (lo, guess - 1)


def optimal_turns(n: int = GuessNumber.N) -> float:
    """Mean guesses of binary search over 1..n, every secret equally likely."""
    def total(size: int, depth: int) -> int:  # guesses summed over the secrets of an interval
        if size == 0:
            return 0
        below = (size - 1) // 2
        return depth + total(below, depth + 1) + total(size - 1 - below, depth + 1)
    return total(n, 1) / n


@lru_cache(maxsize=None)
def _teacher_win(size: int, turns: int) -> float:
    """P(the uniform teacher finds a secret uniform over `size` numbers within `turns`)."""
    if size == 0 or turns == 0:
        return 0.0
    total = 0.0
    for g in range(size):        # the guess, 0-based inside the interval
        for s in range(size):    # the secret
            total += (1.0 if g == s else _teacher_win(g, turns - 1) if s < g
                      else _teacher_win(size - 1 - g, turns - 1))
    return total / size ** 2


def teacher_success(n: int = GuessNumber.N, turns: int = GuessNumber.TURNS) -> float:
    """The teacher's exact chance of winning within `turns` guesses (0.916 for 15 and 6)."""
    return _teacher_win(n, turns)


@lru_cache(maxsize=None)
def teacher_turns(n: int = GuessNumber.N) -> float:
    """The teacher's exact mean number of guesses with no limit on them (4.08 for 15)."""
    if n == 0:
        return 0.0
    # guess g (0-based) of n: the secret is below it g times in n, above it n - 1 - g times
    return sum(1 + (g * teacher_turns(g) + (n - 1 - g) * teacher_turns(n - 1 - g)) / n
               for g in range(n)) / n


def where_in_interval(transcript: list[tuple[str, str]], n: int = GuessNumber.N) -> list[float]:
    """For each legal guess of a transcript, where it falls inside the numbers still possible:
    (guess - lo) / (hi - lo), 0.5 for the middle (binary search), 0 or 1 at the ends. Guesses
    outside the interval (illegal or inconsistent with the replies) and intervals of one
    number are left out."""
    lo, hi, out = 1, n, []
    for (role, text), (_, reply) in zip(transcript, transcript[1:] + [("env", "")]):
        if role != "policy":
            continue
        guess = parse_guess(text, n)
        if guess is None or not lo <= guess <= hi:
            continue
        if hi > lo:
            out.append((guess - lo) / (hi - lo))
        if reply == "higher":
            lo = guess + 1
        elif reply == "lower":
            hi = guess - 1
    return out
