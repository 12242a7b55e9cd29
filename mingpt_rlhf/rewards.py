"""Where an RL run's reward comes from: a reward model, the task's own check, or your function.

    python train_ppo.py --reward rm                    # the reward model in --rm_dir (learned)
    python train_ppo.py --reward task                  # the built-in task's check: reviews' gold
                                                       # reward, sort's exact match
    python train_ppo.py --reward my_reward.py:score    # your function (or package.module:score)

Every source is a callable `reward(sequences, attention_mask, action_mask) -> (B,) float32`
that PPOTrainer calls once per rollout batch, on the token ids (sequences and attention_mask
(B, T + N), left-padded prompts then responses; action_mask (B, N), the response tokens up to
and including EOS).

A reward computed by code sees text, not ids: `TextReward` decodes each prompt and each
response (up to and including its EOS, which the word tokenizer writes as "<eos>" and GPT-2's
BPE as "<|endoftext|>") and calls

    function(prompts: list[str], responses: list[str]) -> list[float]     # one per response

once per rollout batch. What it returns is checked at once: a wrong type or length, a
string, NaN or inf stop the run with one line naming the function and the batch (exit status
2), and so does an exception raised inside the function; the last checkpoint stays as it was.
A response that ends without EOS still gets --missing_eos_penalty instead of the function's
opinion, as with the reward model (ppo_trainer.py).
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys

import torch

from .errors import UserError
from .evaluate import decode_rows


class ModelReward:
    """The frozen reward model's normalised score, in slices of `rows` (the activations of a
    whole rollout batch of long sequences would set the iteration's peak memory)."""

    def __init__(self, rm, rows: int):
        self.rm, self.rows = rm, rows

    def __call__(self, sequences, attention_mask, action_mask) -> torch.Tensor:
        return torch.cat([self.rm(sequences[i:i + self.rows], attention_mask[i:i + self.rows]).float()
                          for i in range(0, len(sequences), self.rows)])


class TextReward:
    """A reward computed from decoded text by `function(prompts, responses) -> list[float]`."""

    def __init__(self, function, name: str, tokenizer):
        self.function, self.name, self.tokenizer = function, name, tokenizer
        self.batches = 0  # rollout batches scored so far (named in errors)

    def texts(self, sequences, attention_mask, action_mask) -> tuple[list[str], list[str]]:
        """(prompts, responses) decoded from a rollout batch (responses include their EOS)."""
        T = sequences.size(1) - action_mask.size(1)
        return (decode_rows(self.tokenizer, sequences[:, :T], attention_mask[:, :T]),
                decode_rows(self.tokenizer, sequences[:, T:], action_mask))

    def __call__(self, sequences, attention_mask, action_mask) -> torch.Tensor:
        prompts, responses = self.texts(sequences, attention_mask, action_mask)
        self.batches += 1
        where = f"reward function {self.name} on rollout batch {self.batches}"
        try:
            scores = self.function(prompts, responses)
        except Exception as e:  # the user's code: one line, not a traceback from deep inside
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UserError(f"{where} raised {type(e).__name__}: {message}; fix the function "
                            f"(the last checkpoint is intact, --resume continues from it)") from None
        return torch.tensor(check_scores(scores, len(responses), where), dtype=torch.float32,
                            device=sequences.device)


def check_scores(scores, n: int, where: str) -> list[float]:
    """`scores` as n finite floats, or a UserError that says what is wrong with them."""
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().cpu().reshape(-1).tolist()
    elif hasattr(scores, "tolist") and not isinstance(scores, (str, bytes)):  # numpy
        scores = scores.tolist()
    if isinstance(scores, (str, bytes)) or not isinstance(scores, (list, tuple)):
        raise UserError(f"{where} returned a {type(scores).__name__}; return a list of {n} "
                        f"floats, one per response")
    if len(scores) != n:
        raise UserError(f"{where} returned {len(scores)} scores for {n} responses; return one "
                        f"float per response, in order")
    out = []
    for i, s in enumerate(scores):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise UserError(f"{where}: score {i} is a {type(s).__name__} ({s!r}); return numbers")
        if not math.isfinite(s):
            raise UserError(f"{where}: score {i} is {s}; return finite numbers (no NaN or inf)")
        out.append(float(s))
    return out


def load_function(spec: str):
    """(function, name) from "path/to/file.py:function" or "package.module:function"."""
    if ":" not in spec:
        raise UserError(f"--reward {spec!r} is not rm, task, FILE.py:FUNCTION or "
                        f"MODULE:FUNCTION")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise UserError(f"--reward {spec!r}: name both a file or module and a function, "
                        f"e.g. my_reward.py:score")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise UserError(f"--reward: no file {where}; pass the path of a .py file")
            module_spec = importlib.util.spec_from_file_location(
                f"reward_{os.path.splitext(os.path.basename(where))[0]}", where)
            module = importlib.util.module_from_spec(module_spec)
            sys.path.insert(0, os.path.dirname(os.path.abspath(where)))  # its own imports
            try:
                module_spec.loader.exec_module(module)
            finally:
                sys.path.pop(0)
        else:
            module = importlib.import_module(where)
    except UserError:
        raise
    except ModuleNotFoundError as e:
        raise UserError(f"--reward: cannot import {where} ({e}); pass FILE.py:FUNCTION or an "
                        f"installed MODULE:FUNCTION") from None
    except Exception as e:
        raise UserError(f"--reward: importing {where} raised {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    function = getattr(module, attr, None)
    if function is None:
        raise UserError(f"--reward: {where} has no {attr!r}; name a function defined there")
    if not callable(function):
        raise UserError(f"--reward: {where}:{attr} is a {type(function).__name__}, not a function")
    return function, f"{where}:{attr}"


def task_reward(task, tokenizer) -> TextReward:
    """The built-in task's own check as a reward (reviews: the gold reward; sort: 1 if exact)."""
    if task is None:
        raise UserError("--reward task needs a built-in task; with --prompts, pass your own "
                        "function: --reward FILE.py:FUNCTION")

    def check(prompts, responses):
        return [task.gold_reward(p, r) for p, r in zip(prompts, responses)]
    return TextReward(check, f"task {task.name}", tokenizer)
