"""What a built-in task is: its three kinds of data in two splits, drawn once from one seed.

A built-in task (tasks.py: "reviews"; task_sort.py: "sort") gives every stage its data: SFT
demonstrations (prompt, response), preference pairs for the reward model, prompts for RL, and
a gold reward. `BuiltinTask` holds what they share: the splits and their cache, so that each
task only says how to draw one kind of data (`_draw_data`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import UserError


@dataclass
class PreferencePair:
    """The labeller preferred `chosen` to `rejected` for `prompt` (texts without "<eos>")."""
    prompt: str
    chosen: str
    rejected: str



class BuiltinTask:
    """What every built-in task shares: three kinds of data (SFT demonstrations "sft",
    preference pairs "pairs", RL prompts "prompts") in two splits ("train", "eval"), each
    drawn once by the task's `_draw_data(kind, split, rng)` and cached. A string seed names
    one stream per (task, seed, kind, split): train and eval never share draws, and seed 1
    "train" is not seed 0 "eval" as it is with seed + offset. random.Random hashes a str seed
    with sha512, so it is the same in every process."""

    name = ""

    def sft_examples(self, split: str) -> list[tuple[str, str]]:
        """Demonstrations (prompt, response) for split "train" or "eval"."""
        return self._data("sft", split)

    def preference_pairs(self, split: str) -> list[PreferencePair]:
        return self._data("pairs", split)

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
