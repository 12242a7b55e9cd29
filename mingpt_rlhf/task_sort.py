"""A built-in task whose answer a program can check: sort a few digits, taught by a teacher
who is sometimes wrong.

    prompt:   "sort 3 1 4 1 5 :"          response:  "1 1 3 4 5 <eos>"

Why this task: it shows what RL from a verifiable reward can do that imitation cannot
(docs/rewards.md). The demonstrations come from an imperfect teacher: on
`teacher_error` (30 %) of the problems it swaps two neighbouring, different digits of its
answer. SFT copies the teacher, mistakes included, so the SFT policy's sampled answers are
wrong about as often as the teacher's. RL against the check (`train_ppo.py --task sort
--reward task`, no reward model) rewards only exact answers and can go past the teacher.

- problems: 3 to 7 digits, 0-9, repeats allowed;
- held out: 1000 problems (split "eval"; SFT evaluates on the first 500, RL on the first
  200) from a stream of their own, the same whatever the run's seed, and never drawn by a
  training split of any seed (demonstrations, pairs, RL prompts). Held out means the problem,
  not its answer: 111 of the 200 RL eval problems have the digits of some training problem
  of seed 1337 in another order, so the same answer (all those with 3 to 5 digits: there are
  only 2,937 such multisets of digits, and training draws tens of thousands of problems).
  So the digits of each held-out problem with 6 or 7 digits are reserved: training never
  draws them, in any order (about 2 % of its draws are redrawn). Those 89 of the 200 are
  `unseen`, and train_ppo.py logs `gold_unseen`, the accuracy on them, beside `gold`;
- `check` / `gold_reward`: 1.0 if the response is exactly the sorted digits followed by
  "<eos>", else 0.0. Strict on purpose: a second answer after the first, a missing "<eos>",
  a digit too many, all score 0 (a lenient parser is a checker that gets hacked);
- `well_formed`: as many digits as the prompt has, then "<eos>" (the right format, right or
  wrong);
- `preference_pairs`: (the right answer, a teacher-style wrong one), for train_rm / train_dpo.

Try it:  python -c "from mingpt_rlhf.tasks import get_task; t=get_task('sort'); print(t.sft_examples('train')[:3])"
"""
from __future__ import annotations

import random

from .machinery.errors import UserError
from .task_base import BuiltinTask, PreferencePair
from .tokenizer import EOS, WordTokenizer

DIGITS = [str(d) for d in range(10)]
VOCAB = ["sort", ":"] + DIGITS
MIN_LEN, MAX_LEN = 3, 7
N_HELD_OUT = 1000    # held-out problems: the eval splits take the first n (500 SFT, 200 RL)
UNSEEN_MIN_LEN = 6   # held-out problems this long reserve their digits (see SortTask)


class SortTask(BuiltinTask):
    name = "sort"

    def __init__(self, seed: int = 0, teacher_error: float = 0.3, n_sft_train: int = 20000,
                 n_sft_eval: int = 500, n_pairs_train: int = 8000, n_pairs_eval: int = 1000,
                 n_prompts_train: int = 2000, n_prompts_eval: int = 200, **_ignored):
        if not 0 <= teacher_error < 1:
            raise UserError(f"teacher_error must be in [0, 1) (got {teacher_error}); try 0.3")
        self.seed, self.teacher_error = seed, teacher_error
        self.sizes = {("sft", "train"): n_sft_train, ("sft", "eval"): n_sft_eval,
                      ("pairs", "train"): n_pairs_train, ("pairs", "eval"): n_pairs_eval,
                      ("prompts", "train"): n_prompts_train, ("prompts", "eval"): n_prompts_eval}
        self._cache = {}
        # the held-out problems: from a stream of their own that no seed names, so that every
        # run (an SFT with seed 1337, PPO with seed 0) evaluates on the same problems and
        # none of them trains on one
        rng = random.Random("sort/held_out")
        self._held_out = []
        while len(self._held_out) < N_HELD_OUT:
            problem = self._draw(rng)
            if problem not in self._held_out:
                self._held_out.append(problem)
        self._held_out_set = set(self._held_out)
        self._reserved = {tuple(sorted(p)) for p in self._held_out if len(p) >= UNSEEN_MIN_LEN}

    def tokenizer(self) -> WordTokenizer:
        return WordTokenizer(VOCAB)

    # ------------------------------------------------------------------------- data
    def _draw_data(self, kind: str, split: str, rng: random.Random) -> list:
        """Demonstrations are the teacher's answers, its mistakes included; pairs are (the
        right answer, a teacher-style wrong one); "eval" draws from the held-out problems."""
        out = []
        for i in range(self.sizes[kind, split]):
            problem = self._held_out[i % len(self._held_out)] if split == "eval" \
                else self._draw_train(rng)
            prompt = self.prompt_of(problem)
            if kind == "prompts":
                out.append(prompt)
            elif kind == "sft":
                out.append((prompt, " ".join(self._teacher(rng, problem))))
            else:
                wrong = self._wrong(rng, problem)
                if wrong is None:  # "5 5 5": no wrong order exists; the right one is enough
                    continue
                out.append(PreferencePair(prompt, chosen=" ".join(map(str, sorted(problem))),
                                          rejected=" ".join(wrong)))
        return out

    @staticmethod
    def _draw(rng: random.Random) -> tuple:
        return tuple(rng.randrange(10) for _ in range(rng.randint(MIN_LEN, MAX_LEN)))

    def _draw_train(self, rng: random.Random) -> tuple:
        while True:
            problem = self._draw(rng)
            if problem not in self._held_out_set and tuple(sorted(problem)) not in self._reserved:
                return problem

    def unseen(self, prompt: str) -> bool:
        """True for a held-out problem whose digits, in any order, no training split of any
        seed holds: its answer was never shown. (Most held-out problems have the digits of
        some training problem in another order, and so the same answer.)"""
        digits = self._digits(prompt)
        return digits is not None and tuple(sorted(map(int, digits))) in self._reserved

    def extra_eval_figures(self, prompts: list[str], responses: list[str]) -> dict:
        """{"gold_unseen": exact-match accuracy on the `unseen` prompts}, if any: what the
        policy does on answers it never saw, beside `gold` on all held-out prompts."""
        golds = [self.gold_reward(p, r) for p, r in zip(prompts, responses) if self.unseen(p)]
        return {"gold_unseen": sum(golds) / len(golds)} if golds else {}

    @staticmethod
    def prompt_of(problem) -> str:
        return "sort " + " ".join(map(str, problem)) + " :"

    def _teacher(self, rng: random.Random, problem) -> list[str]:
        """The teacher's answer: right, or on `teacher_error` of the problems, wrong."""
        if rng.random() < self.teacher_error:
            wrong = self._wrong(rng, problem)
            if wrong is not None:
                return wrong
        return [str(d) for d in sorted(problem)]

    @staticmethod
    def _wrong(rng: random.Random, problem) -> list[str] | None:
        """The sorted digits with two neighbouring, different digits swapped (None if all the
        digits are equal)."""
        answer = sorted(problem)
        places = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
        if not places:
            return None
        i = rng.choice(places)
        answer[i], answer[i + 1] = answer[i + 1], answer[i]
        return [str(d) for d in answer]

    # ------------------------------------------------------------------------- the check
    @staticmethod
    def _digits(prompt: str) -> list[str] | None:
        words = prompt.split()
        if len(words) < 3 or words[0] != "sort" or words[-1] != ":" \
                or not all(w in DIGITS for w in words[1:-1]):
            return None
        return words[1:-1]

    def check(self, prompt: str, response: str) -> bool:
        """Exactly the sorted digits of the prompt, then "<eos>", and nothing else."""
        digits = self._digits(prompt)
        return digits is not None and response.split() == sorted(digits) + [EOS]

    def gold_reward(self, prompt: str, response: str) -> float:
        return float(self.check(prompt, response))

    def well_formed(self, prompt: str, response: str) -> bool:
        """As many digits as the prompt, then "<eos>": the format, right or wrong."""
        digits, words = self._digits(prompt), response.split()
        return digits is not None and len(words) == len(digits) + 1 and words[-1] == EOS \
            and all(w in DIGITS for w in words[:-1])
