"""Signs of reward hacking, from figures a run has without any gold reward, and an alarm.

Against a learned reward the true reward rises, then falls (docs/overoptimization.md); a user
has no gold to see the turn. What they have, every iteration (metrics.jsonl's training lines):

    signal           from                 what it measures at iteration t (windows of W iterations)
    disagreement     ens_std              the ensemble members' spread on the rollouts: the
                                          last window's mean over the first window's, minus 1
    heldout_gap      heldout_gap          the training reward model's score minus a held-out
                                          one's on the same rollouts: last window's mean minus
                                          the first window's
    kl_accel         kl                   the KL's acceleration: with A, B, C the means of the
                                          last three windows (oldest first), (C - B) - (B - A)
    kl_level         kl                   the last window's mean KL (nats per response)
    length_drift     resp_len             the last window's mean length over the first's, minus 1
    entropy_trend    entropy              the least-squares slope of the entropy over the last
                                          2 W iterations, over the first window's mean entropy
                                          (a relative change per iteration; < 0: collapsing)

The first two need an ensemble as the reward (`train_ppo.py --rm_dir` of train_rm.py
--ensemble K) and a held-out reward model (`--heldout_rm_dir`); the others are always there.
A signal is None until the history holds three windows.

What they are worth was measured against the gold on bench/reward_hacking.py's PPO runs
(docs/reward_hacking.md): none of them warns *before* the gold's peak without firing as often
in runs that never overoptimize, because on the built-in task the gold collapses within a few
iterations of its peak and the other signals move as much in healthy runs. So the rule
(`warns`) is an alarm, not a forecast: it fires when the policy has run away from the
reference, the KL's level past ALARM_KL nats per response, fitted on two seeds' runs of the
study. Every signal is still logged, and `fired` names those past their THRESHOLDS (scales
chosen by reasoning, not fitted) in the alarm's message.

    from mingpt_rlhf.lab.hacking import HackingMonitor
    monitor = HackingMonitor(window=5)
    figures, message = monitor.update(stats)   # each iteration: signals + hacking_warning
"""
from __future__ import annotations

import contextlib

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


def signals(history: list[dict], window: int) -> dict:
    """Each signal (module docstring) at the last row of `history` (dicts with kl, resp_len,
    entropy, and where logged ens_std, heldout_gap); None where it cannot be computed yet or
    its figure is not logged."""
    W = window
    out = dict.fromkeys(THRESHOLDS)
    if len(history) < 3 * W:
        return out
    first, a, b, c = history[:W], history[-3 * W:-2 * W], history[-2 * W:-W], history[-W:]
    if None not in (kl := [_mean(rows, "kl") for rows in (a, b, c)]):
        out["kl_accel"] = (kl[2] - kl[1]) - (kl[1] - kl[0])
        out["kl_level"] = kl[2]
    length0, length = _mean(first, "resp_len"), _mean(c, "resp_len")
    if length0 and length is not None:
        out["length_drift"] = length / length0 - 1
    entropy0 = _mean(first, "entropy")
    recent = [r["entropy"] for r in history[-2 * W:] if r.get("entropy") is not None]
    if entropy0 and len(recent) == 2 * W:
        out["entropy_trend"] = _slope(recent) / entropy0
    spread0, spread = _mean(first, "ens_std"), _mean(c, "ens_std")
    if spread0 and spread is not None:
        out["disagreement"] = spread / spread0 - 1
    gap0, gap = _mean(first, "heldout_gap"), _mean(c, "heldout_gap")
    if gap0 is not None and gap is not None:
        out["heldout_gap"] = gap - gap0
    return out


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
