"""What a built-in task is: its three kinds of data in two splits, drawn once from one seed.

A built-in task (tasks.py: "reviews"; task_sort.py: "sort") gives every stage its data: SFT
demonstrations (prompt, response), preference pairs for the reward model, prompts for RL, and
a gold reward. `BuiltinTask` holds what they share: the splits and their cache, so that each
task only says how to draw one kind of data (`_draw_data`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass


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
