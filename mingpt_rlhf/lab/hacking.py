"""Signs of reward hacking, from figures a run has without any gold reward, and an alarm.

Against a learned reward the true reward rises, then falls (docs/overoptimization.md); a user
has no gold to see the turn. What they have, every iteration (metrics.jsonl's training lines),
becomes the signals of SIGNALS below, each over windows of W iterations: the ensemble's
disagreement and a held-out reward model's gap (when the run has them: `train_ppo.py --rm_dir`
of an ensemble, `--heldout_rm_dir`), the KL's acceleration and level, the drift of the length,
the trend of the entropy. A signal is None until the history holds three windows.

What they are worth was measured against the gold on bench/reward_hacking.py's PPO runs
(docs/reward_hacking.md): none of them warns *before* the gold's peak without firing as often
in runs that never overoptimize. So the rule (`warns`) is an alarm, not a forecast: it fires
when the policy has run away from the reference, the KL's level past ALARM_KL nats per
response, fitted on two seeds' runs of the study. Every signal is still logged, and `fired`
names those past their THRESHOLDS (scales chosen by reasoning, not fitted) in the message.

    monitor = HackingMonitor(window=5)
    figures, message = monitor.update(stats)   # each iteration: signals + hacking_warning
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from ..rewards import ModelReward

ALARM_KL = 20.0  # nats per response: chosen on the study's seeds 0 and 1 (docs/reward_hacking.md)
# signal -> (threshold, direction): +1 fires above it, -1 below it, 0 when |value| passes it
THRESHOLDS = {
    "disagreement": (0.5, +1),     # the members' spread up by half
    "heldout_gap": (0.5, +1),      # half a standard deviation of the SFT samples' scores
    "kl_accel": (0.5, +1),         # nats: e.g. from +0.1 to +0.2 nats per iteration, W = 5
    "kl_level": (ALARM_KL, +1),    # the alarm
    "length_drift": (0.25, 0),     # a quarter longer, or shorter
    "entropy_trend": (-0.01, -1),  # losing 1 % of the starting entropy per iteration
}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _slope(values: list[float]) -> float:
    """Least-squares slope of values against 0, 1, 2, ..."""
    n = len(values)
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    num = sum((i - x_mean) * (v - y_mean) for i, v in enumerate(values))
    return num / sum((i - x_mean) ** 2 for i in range(n))


class Windows(NamedTuple):
    """The history's first window of W iterations and its last three, oldest first."""
    first: list
    a: list
    b: list
    c: list


def _ratio_change(key: str):
    """The signal: the last window's mean of `key` over the first's, minus 1."""
    def signal(h: Windows):
        start, last = _mean(h.first, key), _mean(h.c, key)
        return last / start - 1 if start and last is not None else None
    return signal


def _difference(key: str):
    """The signal: the last window's mean of `key` minus the first's."""
    def signal(h: Windows):
        start, last = _mean(h.first, key), _mean(h.c, key)
        return None if start is None or last is None else last - start
    return signal


def _kl_accel(h: Windows):
    """(C - B) - (B - A), with A, B, C the KL's means over the last three windows."""
    kl = [_mean(rows, "kl") for rows in (h.a, h.b, h.c)]
    return None if None in kl else (kl[2] - kl[1]) - (kl[1] - kl[0])


def _entropy_trend(h: Windows):
    """The least-squares slope of the entropy over the last two windows, over the first
    window's mean entropy (a relative change per iteration; < 0: collapsing)."""
    start, recent = _mean(h.first, "entropy"), [r.get("entropy") for r in h.b + h.c]
    return _slope(recent) / start if start and None not in recent else None


# signal -> its value from the Windows of the history, or None (its figure not logged)
SIGNALS = {
    "disagreement": _ratio_change("ens_std"),  # the ensemble members' spread on the rollouts
    "heldout_gap": _difference("heldout_gap"),  # the training RM's score minus a held-out one's
    "kl_accel": _kl_accel,
    "kl_level": lambda h: _mean(h.c, "kl"),     # nats per response
    "length_drift": _ratio_change("resp_len"),
    "entropy_trend": _entropy_trend,
}


def signals(history: list[dict], window: int) -> dict:
    """Each signal of SIGNALS at the last row of `history` (dicts with kl, resp_len, entropy,
    and where logged ens_std, heldout_gap); None where it cannot be computed yet."""
    W = window
    if len(history) < 3 * W:
        return dict.fromkeys(SIGNALS)
    h = Windows(history[:W], history[-3 * W:-2 * W], history[-2 * W:-W], history[-W:])
    return {name: signal(h) for name, signal in SIGNALS.items()}


def fired(values: dict) -> list[str]:
    """The signals past their threshold, in THRESHOLDS' order."""
    hits = []
    for name, (threshold, direction) in THRESHOLDS.items():
        v = values.get(name)
        if v is None:
            continue
        if (direction > 0 and v > threshold) or (direction < 0 and v < threshold) or \
                (direction == 0 and abs(v) > threshold):
            hits.append(name)
    return hits


def warns(values: dict) -> bool:
    """The rule: the KL's level past ALARM_KL (the module docstring says why only that)."""
    return "kl_level" in fired(values)


def first_warning(history: list[dict], window: int) -> int | None:
    """The "step" of the first row at which the rule fires on the history up to it, or None."""
    for t in range(1, len(history) + 1):
        if warns(signals(history[:t], window)):
            return history[t - 1]["step"]
    return None


class HackingMonitor:
    """The signals and the warning, iteration by iteration (train_ppo.py logs them). `history`:
    the training rows already logged (a resumed run's), so a warning that fired before the
    resume is not printed again."""

    def __init__(self, window: int, history: list[dict] = ()):
        self.window = window
        self.history = list(history)
        self.warned = any(r.get("hacking_warning") for r in self.history)

    def update(self, stats: dict, step: int) -> tuple[dict, str | None]:
        """(figures to log: each signal and hacking_warning, the one-line message to print
        the first time the warning is on, else None)."""
        self.history.append({"step": step, **stats})
        values = signals(self.history, self.window)
        on = warns(values)
        figures = {f"signal_{k}": v for k, v in values.items() if v is not None}
        figures["hacking_warning"] = on
        message = None
        if on and not self.warned:
            self.warned = True
            shown = ", ".join(f"{k} {values[k]:+.3f}" for k in fired(values))
            message = (f"warning: signs of reward hacking at iteration {step}: the policy has run "
                       f"away from the reference (KL {values['kl_level']:.1f} nats per response, "
                       f"alarm at {ALARM_KL:g}; past their thresholds: {shown}). Look at the "
                       f"samples in report.html; if they game the reward model, go back to an "
                       f"earlier checkpoint and raise --kl_coef (docs/reward_hacking.md)")
        return figures, message


class HeldOutGap:
    """A reward source that also scores every batch with a held-out reward model (one that
    never trained the policy), keeping the gap between the two: `figures()` gives
    heldout_gap, the mean of (reward - held-out score) since `begin`, and the wrapped
    source's own figures (an ensemble's ens_std). PPO trains on the wrapped source's scores."""

    def __init__(self, reward_fn, heldout, rows: int, amp=contextlib.nullcontext):
        self.reward_fn = reward_fn
        self.heldout = ModelReward(heldout, rows, amp)
        self.clipped = getattr(reward_fn, "clipped", True)  # PPOTrainer clips as it would
        self.gaps = []

    def begin(self, at: str = "") -> None:
        self.gaps = []
        if hasattr(self.reward_fn, "begin"):
            self.reward_fn.begin(at)

    def __call__(self, sequences, attention_mask, action_mask, **fields) -> torch.Tensor:
        scores = self.reward_fn(sequences, attention_mask, action_mask, **fields)
        self.gaps.append(scores.float() - self.heldout(sequences, attention_mask, action_mask))
        return scores

    def figures(self) -> dict:
        figures = self.reward_fn.figures() if hasattr(self.reward_fn, "figures") else {}
        if self.gaps:
            figures["heldout_gap"] = torch.cat(self.gaps).mean().item()
        return figures
