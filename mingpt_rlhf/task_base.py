"""What a built-in task is: its three kinds of data in two splits, drawn once from one seed.

A built-in task (tasks.py: "reviews"; task_sort.py: "sort") gives every stage its data: SFT
demonstrations (prompt, response), preference pairs for the reward model, prompts for RL, and
a gold reward. `BuiltinTask` holds what they share: the splits and their cache, so that each
task only says how to draw one kind of data (`_draw_data`).

The labeller that labels a task's preference pairs can be given two faults of real labellers
(`train_rm.py --label_noise p --length_bias a`, `labeller_faults`): labels flipped at random,
and a taste for longer responses. The gold reward does not change: it measures what the
faults cost (docs/reward_hacking.md).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .machinery.errors import UserError


@dataclass
class PreferencePair:
    """The labeller preferred `chosen` to `rejected` for `prompt` (texts without "<eos>")."""
    prompt: str
    chosen: str
    rejected: str



def response_length(text: str) -> int:
    """A response's length as the labeller sees it: its words (the tokens of a word tokenizer)."""
    return len(text.split())


def check_labeller_faults(label_noise: float, length_bias: float) -> None:
    """UserError unless both faults are probabilities a labeller can have."""
    if not 0 <= label_noise <= 0.5:
        raise UserError(f"--label_noise is the probability of flipping a label, in "
                        f"[0, 0.5] (0.5 is pure noise), got {label_noise}")
    if not 0 <= length_bias <= 1:
        raise UserError(f"--length_bias is the probability that the labeller picks the "
                        f"longer response, in [0, 1], got {length_bias}")


def labeller_faults(pairs: list[PreferencePair], label_noise: float, length_bias: float,
                    rng: random.Random) -> list[PreferencePair]:
    """The pairs as a faulty labeller labels them. For each pair, two uniform draws u, v:

    - length bias a: if u < a and the two responses differ in length (`response_length`), the
      longer one is chosen, whatever the gold; otherwise the task's own label stands. So a is
      the share of labels decided by length alone (a mixture of two labellers, not a weight
      inside the Bradley-Terry logit): on the pairs whose own label chose the shorter
      response, a of them now choose the longer;
    - label noise p: then, if v < p, the label is flipped, so a share p of all labels is
      swapped (Coste et al.'s "25 % label noise" is p = 0.25), on top of the task's own
      labeller, which already errs on close calls.

    Both draws are made for every pair, whatever a and p, so the stream stays in step."""
    faulty = []
    for pair in pairs:
        u, v = rng.random(), rng.random()
        chosen, rejected = pair.chosen, pair.rejected
        if u < length_bias and response_length(chosen) < response_length(rejected):
            chosen, rejected = rejected, chosen
        if v < label_noise:
            chosen, rejected = rejected, chosen
        faulty.append(PreferencePair(pair.prompt, chosen, rejected))
    return faulty


class BuiltinTask:
    """What every built-in task shares: three kinds of data (SFT demonstrations "sft",
    preference pairs "pairs", RL prompts "prompts") in two splits ("train", "eval"), each
    drawn once by the task's `_draw_data(kind, split, rng)` and cached. A string seed names
    one stream per (task, seed, kind, split): train and eval never share draws, and seed 1
    "train" is not seed 0 "eval" as it is with seed + offset. random.Random hashes a str seed
    with sha512, so it is the same in every process.

    Adding a task: subclass this class as tasks.ReviewsTask does (it gives the splits,
    `check_vocabulary` and `extra_eval_figures`), write `tokenizer`, `_draw_data`,
    `gold_reward` and `well_formed`, and add it to `tasks.TASKS`; the training scripts find it
    by name."""

    name = ""

    def sft_examples(self, split: str) -> list[tuple[str, str]]:
        """Demonstrations (prompt, response) for split "train" or "eval"."""
        return self._data("sft", split)

    # the labeller's faults (`set_labeller`): 0 = the task's own labeller, untouched
    label_noise = 0.0
    length_bias = 0.0

    def preference_pairs(self, split: str) -> list[PreferencePair]:
        """The labelled pairs of `split`, with the labeller's faults (`set_labeller`) applied."""
        pairs = self._data("pairs", split)
        if not (self.label_noise or self.length_bias):
            return pairs
        # the faults draw from their own stream, so the pairs and their clean labels are the
        # same at every setting, and a pair flipped at p = 0.1 is flipped at p = 0.25 too
        faults = random.Random(f"{self.name}/{self.seed}/labeller_faults/{split}")
        return labeller_faults(pairs, self.label_noise, self.length_bias, faults)

    def set_labeller(self, label_noise: float = 0.0, length_bias: float = 0.0) -> None:
        """Give the labeller two faults a real one has; the gold reward stays exact
        (`labeller_faults` says what each does). Impossible values are a UserError."""
        check_labeller_faults(label_noise, length_bias)
        self.label_noise, self.length_bias = label_noise, length_bias

    def prompts(self, split: str) -> list[str]:
        return self._data("prompts", split)

    def _data(self, kind: str, split: str) -> list:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if (kind, split) not in self._cache:
            rng = random.Random(f"{self.name}/{self.seed}/{kind}/{split}")
            self._cache[kind, split] = self._draw_data(kind, split, rng)
        return list(self._cache[kind, split])  # a copy, so a caller's shuffle cannot leak

    def extra_eval_figures(self, prompts: list[str], responses: list[str]) -> dict:
        """Figures of held-out responses beyond `gold` and `well_formed` (none here; the sort
        task adds its accuracy on problems whose digits never occur in training)."""
        return {}

    def check_vocabulary(self, tokenizer, policy_from: str, fix: str = "") -> None:
        """UserError when the policy from `policy_from` cannot read this task's text: its word
        tokenizer (a policy of the other task, or of a file's words) has no id for some of the
        task's words, which would all encode as <unk>: a sort problem given to a reviews
        policy is "<unk> <unk> ...", and the check scores even the right answer 0. GPT-2's
        byte-level BPE encodes any text, so a GPT-2 policy passes."""
        unk = getattr(tokenizer, "unk_id", None)
        if unk is None:  # no <unk> id: every text has its own tokens
            return
        unknown = [w for w in self.tokenizer().itos[3:] if tokenizer.encode(w) == [unk]]
        if not unknown:
            return
        fix = fix or (f"train an SFT on --task {self.name} first (train_sft.py --task {self.name} "
                      f"--out_dir out/{self.name}/sft) and pass that folder as --sft_dir")
        words = ", ".join(unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise UserError(f"--task {self.name} has words that the tokenizer of the policy in "
                        f"{policy_from} does not know ({words}: it was trained on other words); "
                        f"{fix}")
