"""Where an RL run's reward comes from: a reward model, the task's own check, or your function.

    python train_ppo.py --reward rm                    # the reward model in --rm_dir (learned)
    python train_ppo.py --reward task                  # the built-in task's check
    python train_ppo.py --reward my_reward.py:score    # your function (or package.module:score)

Every source is a callable `reward(sequences, attention_mask, action_mask, **fields) -> (B,)`
float32, called once per rollout batch on the token ids; `TextReward`'s docstring gives a
function's contract. Only a reward model's scores are clipped (docs/rewards.md).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys

import torch

from .machinery.errors import UserError
from .evaluate import decode_rows


class ModelReward:
    """The frozen reward model's normalised score, in slices of `rows` (the activations of a
    whole rollout batch of long sequences would set the iteration's peak memory), under
    `amp()` (the run's mixed precision)."""

    clipped = True  # normalised scores: --reward_clip cuts only their outliers

    def __init__(self, rm, rows: int, amp=contextlib.nullcontext):
        self.rm, self.rows, self.amp = rm, rows, amp

    def begin(self, at: str = "") -> None:
        """Where the run is (an eval, an iteration): a reward with state starts anew here."""

    def figures(self) -> dict:
        """What this reward measured since `begin`, to log (an ensemble's ens_std)."""
        return {}

    def __call__(self, sequences, attention_mask, action_mask, **fields) -> torch.Tensor:
        with self.amp():
            return torch.cat([self.rm(sequences[i:i + self.rows], attention_mask[i:i + self.rows]).float()
                              for i in range(0, len(sequences), self.rows)])


class TextReward:
    """A reward computed by code from decoded text: each prompt and each response (up to and
    including its EOS, which the word tokenizer writes as "<eos>" and GPT-2's BPE as
    "<|endoftext|>") go, once per rollout batch, to

        function(prompts: list[str], responses: list[str], **fields) -> list[float]

    one number per response. Every field of a `--prompts` JSONL row besides "prompt" (a
    reference answer, unit tests, ...) reaches the function as a keyword argument holding one
    value per response, in the order of `responses` (a GRPO group repeats its prompt's value);
    a function that does not name a field (and takes no **kwargs) is not given it.

    What the function returns is checked at once: any real numbers (Python, numpy, 0-d
    tensors), as a list or as an array or tensor of any shape holding exactly one number per
    response. A wrong count, a string, a bool, NaN or inf (also a finite number too large for
    float32) stop the run with one line naming the function and the batch (exit status 2), and
    so does an exception raised inside the function; the last checkpoint stays as it was. The
    function runs outside the policy's autocast: a torch scorer of yours computes in its own
    dtype (float32 unless it says otherwise). A response that ends without EOS still gets
    --missing_eos_penalty instead of the function's opinion, as with the reward model, unless
    --penalize_missing_eos false keeps it (a task whose responses have no EOS)."""
    clipped = False  # --reward_clip is for the reward model's scores (module docstring)

    def __init__(self, function, name: str, tokenizer):
        self.function, self.name, self.tokenizer = function, name, tokenizer
        self.wanted = fields_taken(function)
        # where the run is, named in errors; the script sets it ("iteration 12", "the eval at
        # iteration 20"), and batches counts the rollout batches scored there
        self.at, self.batches = "", 0

    def begin(self, at: str) -> None:
        """Name the phase of the run the next calls score (errors say it)."""
        self.at, self.batches = at, 0

    def figures(self) -> dict:
        return {}

    def texts(self, sequences, attention_mask, action_mask) -> tuple[list[str], list[str]]:
        """(prompts, responses) decoded from a rollout batch (responses include their EOS)."""
        T = sequences.size(1) - action_mask.size(1)
        return (decode_rows(self.tokenizer, sequences[:, :T], attention_mask[:, :T]),
                decode_rows(self.tokenizer, sequences[:, T:], action_mask))

    def __call__(self, sequences, attention_mask, action_mask, **fields) -> torch.Tensor:
        prompts, responses = self.texts(sequences, attention_mask, action_mask)
        self.batches += 1
        where = f"reward function {self.name} on rollout batch {self.batches}"
        where += f" of {self.at}" if self.at else ""
        given = {k: v for k, v in fields.items() if self.wanted is None or k in self.wanted}
        try:
            # outside the policy's autocast: the user's code computes in its own dtype
            with torch.autocast(sequences.device.type, enabled=False):
                scores = self.function(prompts, responses, **given)
        except Exception as e:  # the user's code: one line, not a traceback from deep inside
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UserError(f"{where} raised {type(e).__name__}: {message}; fix the function "
                            f"(the last checkpoint is intact, --resume continues from it)") from None
        return torch.tensor(check_scores(scores, len(responses), where), dtype=torch.float32,
                            device=sequences.device)


def check_scores(scores, n: int, where: str) -> list[float]:
    """`scores` as n floats finite in float32, or a UserError that says what is wrong.
    Taken: a list or tuple of real numbers (Python's, numpy's, 0-d tensors), or a tensor or
    numpy array of any shape holding exactly n numbers."""
    if hasattr(scores, "shape") and hasattr(scores, "tolist"):  # a tensor or numpy array
        scores = scores.reshape(-1).tolist()  # any shape holding n numbers
    if isinstance(scores, (str, bytes)) or not isinstance(scores, (list, tuple)):
        raise UserError(f"{where} returned a {type(scores).__name__}; return a list of {n} "
                        f"floats, one per response")
    if len(scores) != n:
        raise UserError(f"{where} returned {len(scores)} scores for {n} responses; return one "
                        f"float per response, in order")
    return [real_number(s, f"{where}: score {i}") for i, s in enumerate(scores)]


def real_number(value, what: str) -> float:
    """`value` as a float (rounded to float32), or a UserError naming `what`, the value and its
    type. Taken: any real number, Python's, numpy's or a 0-d tensor, finite in float32. Used
    for a function's scores and an environment's rewards (methods/episodes.py)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()  # a 0-d tensor
    # bools are refused: numpy's bool_ is no numbers.Real, Python's bool is an int
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{what} is a {type(value).__name__} ({value!r}); return a number")
    # finite after the cast to the float32 the run computes in: 1e39 is inf there
    as_float32 = torch.tensor(float(value), dtype=torch.float32).item()
    if not math.isfinite(as_float32):
        raise UserError(f"{what} is a {type(value).__name__} {float(value)} ({as_float32} in "
                        f"float32); return a finite number (no NaN or inf, |x| < 3.4e38)")
    return as_float32


def fields_taken(function) -> set | None:
    """Keyword arguments `function` takes besides (prompts, responses): None when it takes
    **kwargs (then every field is given), else the set of its other parameter names."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: give it no fields
        return set()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {p.name for p in params[len(positional[:2]):] if p.kind is not p.VAR_POSITIONAL}


def load_function(spec: str, flag: str = "--reward", kind: str = "FUNCTION"):
    """(object, name) from "path/to/file.py:name" or "package.module:name": a reward function
    (`flag` --reward) or an environment class (--env, `kind` CLASS)."""
    example = "my_reward.py:score" if kind == "FUNCTION" else "my_env.py:MyEnv"
    if ":" not in spec:
        raise UserError(f"{flag} {spec!r} is not FILE.py:{kind} or MODULE:{kind}")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise UserError(f"{flag} {spec!r}: name both a file or module and a {kind.lower()}, "
                        f"e.g. {example}")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise UserError(f"{flag}: no file {where}; pass the path of a .py file")
            module_spec = importlib.util.spec_from_file_location(
                f"user_{os.path.splitext(os.path.basename(where))[0]}", where)
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
        raise UserError(f"{flag}: cannot import {where} ({e}); pass FILE.py:{kind} or an "
                        f"installed MODULE:{kind}") from None
    except Exception as e:
        raise UserError(f"{flag}: importing {where} raised {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    found = getattr(module, attr, None)
    if found is None:
        raise UserError(f"{flag}: {where} has no {attr!r}; name a {kind.lower()} defined there")
    if not callable(found):
        raise UserError(f"{flag}: {where}:{attr} is a {type(found).__name__}, not a "
                        f"{kind.lower()}")
    return found, f"{where}:{attr}"


def task_reward(task, tokenizer) -> TextReward:
    """The built-in task's own check as a reward (reviews: the gold reward; sort: 1 if exact)."""
    if task is None:
        raise UserError("--reward task needs a built-in task; with --prompts, pass your own "
                        "function: --reward FILE.py:FUNCTION")

    def check(prompts, responses):
        return [task.gold_reward(p, r) for p, r in zip(prompts, responses)]
    return TextReward(check, f"task {task.name}", tokenizer)
