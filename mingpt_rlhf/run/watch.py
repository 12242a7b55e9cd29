"""What the RL script says while a run goes: its warnings, and the reward-hacking signals.

A run can go wrong in ways its progress bar does not show. Each warning of WARNINGS is one
line that names the state and what to try (most are said once): most first responses cut off
at --max_new_tokens; an update that took no optimizer step; the KL above twice --kl_target for
a tenth of the run; the adaptive beta at its upper bound; a stuck run (`RunWatch.no_signal`:
no reward signal for STUCK_AFTER iterations below the SFT policy's level, or tied since the
first iteration below the most an episode can return). The figures behind them are logged, and
so are the reward-hacking signals (lab/hacking.py) and `max_logratio` (`largest_logratio`):
how far the one token that moved most has moved from the reference over the whole vocabulary,
which the KL figures (means over sampled tokens) do not see.

    watch = RunWatch(cfg, best)   # best: the most a response or episode can earn, if known
    stats.update(watch.check(stats, step, kl_ctl))  # each iteration, before the line is logged
"""
from __future__ import annotations

import contextlib
import math

import torch
from tqdm import tqdm

from ..machinery.distributed import is_main, max_over_ranks
from ..lab.hacking import HackingMonitor
from ..machinery.lora import adapters_disabled
from ..logprobs import CHUNK_ELEMENTS, tempered_log_softmax

STUCK_AFTER = 10  # iterations without a reward signal, below the SFT level, before it says so
SFT_ITERATIONS = 3  # the first iterations, whose mean reward is the SFT policy's level


def largest_logratio(trainer, exp) -> float:
    """The largest log pi(v | prefix) - log ref(v | prefix) over the whole vocabulary at the
    action positions of `exp` (the first minibatch the update trained on, `trainer.
    first_minibatch`: every process's rows), after the update: mass moving onto a token no
    rollout samples, which the KL figures (means over sampled tokens) do not see. 0 when the
    update trained on nothing (dynamic sampling kept no group)."""
    if exp is None:
        return 0.0
    seqs, attn, T = exp.sequences, exp.attention_mask, exp.prompt_len
    actions, actor, largest = exp.action_mask.bool(), trainer.actor, 0.0  # (max >= 0)
    ref = trainer.ref if trainer.ref is not None else actor  # LoRA: the actor, adapters off
    log_softmax = lambda model, hidden: tempered_log_softmax(  # as scored; PAD: the same floor
        model.logits(hidden).float(), trainer.cfg.temperature, trainer.suppress)
    with torch.no_grad(), trainer.amp():
        hidden = actor.trunk(seqs, attn)[:, T - 1:-1][actions]  # (M, C)
        with adapters_disabled(actor) if trainer.ref is None else contextlib.nullcontext():
            ref_hidden = ref.trunk(seqs, attn)[:, T - 1:-1][actions]
        step = max(1, CHUNK_ELEMENTS // actor.config.vocab_size)  # (step, V) logits at a time
        for p, r in zip(hidden.split(step), ref_hidden.split(step)):  # (no adapted output layer)
            largest = max(largest, (log_softmax(actor, p) - log_softmax(ref, r)).max().item())
    return max_over_ranks(largest)


def idle_update_warning(stats: dict, step: int, target_kl: float) -> str:
    """The line printed the first time an iteration's update takes no optimizer step, with
    its cause: an iteration that learned nothing must not pass unseen."""
    if stats["early_stop_kl"] > 0:
        cause = (f"its first minibatch's approx-KL {stats['early_stop_kl']:.4g} already passed "
                 f"--target_kl {target_kl:g} before any step (it is measured from the "
                 f"learner's own log-probs, so the scoring and the learning pass disagree: "
                 f"compare --dtype float32, or raise --target_kl)")
    elif "kept_rows" in stats and stats["kept_rows"] == 0:
        cause = "dynamic sampling kept no group with a signal (every group's scores tied)"
    else:
        cause = "every loss was non-finite (see skipped_updates)"
    return (f"warning: iteration {step}'s update took no optimizer step: {cause}. The run's "
            f"closing lines count such updates")


def cut_off_warning(stats: dict, cfg) -> str:
    """The line printed when most of the first iteration's responses ran out of tokens."""
    return (f"warning: {1 - stats['eos_rate']:.0%} of the responses were cut off at "
            f"--max_new_tokens {cfg.max_new_tokens} without EOS, and their scores replaced by "
            f"--missing_eos_penalty {cfg.missing_eos_penalty:g}: the run learns from the "
            f"penalty, not the reward. For a task without EOS (a text continued for a fixed "
            f"length) pass --penalize_missing_eos false; else raise --max_new_tokens")


def kl_warning(stats: dict, cfg, kl_high: int, beta: float) -> str:
    """The line printed when the KL has been above twice --kl_target in a tenth of the run,
    with advice in the options this run reads (online DPO's KL is its beta)."""
    hold = (f"raise --dpo_beta (now {cfg.dpo_beta:g})" if cfg.algo == "online_dpo" else
            f"raise --kl_coef (the starting beta, now {beta:.3g}), lower --kl_horizon (beta "
            f"reacts faster)" if cfg.adaptive_kl else f"raise --kl_coef (beta, now {beta:.3g})")
    return (f"warning: the KL to the SFT policy has been above twice --kl_target "
            f"({2 * cfg.kl_target:g} nats) in {kl_high} iterations (now {stats['kl']:.1f}). To "
            f"hold it: {hold}, lower --actor_lr, or set --target_kl (stops an update early); or "
            f"accept it with a larger --kl_target")


def stuck_warning(stats: dict, step: int, sft_level: float | None, best: float | None) -> str:
    """The line printed when a run has had no reward signal for STUCK_AFTER iterations: below
    its SFT level (`sft_level`), or tied from the start (`sft_level` None) below `best`."""
    why = ("every group's rewards tied" if stats.get("zero_groups", 0.0) >= 1.0 else
           f"the policy writes one answer (entropy {stats['entropy']:.3f} nats)")
    if sft_level is not None:
        where = (f"while its reward ({stats['score']:.3f}) stayed below its SFT policy's "
                 f"({sft_level:.3f})")
    else:
        most = (f"below the most a response can earn ({best:g})" if best is not None else
                "(if that is the most a response can earn, the run is done: ignore this)")
        where = f"since its first iteration, at a reward of {stats['score']:.3f} {most}"
    return (f"warning: the run is stuck: for {STUCK_AFTER} iterations up to {step} no reward "
            f"signal reached the policy ({why}) {where}; such runs rarely recover. Start again "
            f"with the KL penalty in the loss (--kl_in loss, if it is not there already) or a "
            f"lower --actor_lr (docs/troubleshooting.md, \"a run that stopped learning\")")


def bound_warning(stats: dict, step: int, kl_ctl) -> str:
    """The line printed the first time the adaptive KL coefficient is held at its upper bound."""
    return (f"warning: the adaptive KL coefficient reached its upper bound at iteration {step} "
            f"(beta {kl_ctl.value:.3g}, {kl_ctl.RANGE:g}x --kl_coef) with the KL at "
            f"{stats['kl']:.1f} nats against --kl_target {kl_ctl.target:g}; it goes no higher, so "
            f"that a policy that comes back can learn again. If the KL does not come down, the "
            f"run has likely collapsed (docs/troubleshooting.md): raise --kl_coef, or lower "
            f"--actor_lr")


# The run's warnings, checked every iteration by RunWatch.check: name -> (due(watch, stats,
# step, kl_ctl), line(watch, stats, step, kl_ctl), said once). A line is built only when due.
WARNINGS = {
    "stuck": (lambda w, s, step, kl_ctl: s["stuck"] == STUCK_AFTER,
              lambda w, s, step, kl_ctl: stuck_warning(
                  s, step, None if w.tied_from_start else w.sft_level, w.best), False),
    "beta at its bound": (lambda w, s, step, kl_ctl: kl_ctl.value >= kl_ctl.high,
                          lambda w, s, step, kl_ctl: bound_warning(s, step, kl_ctl), True),
    "idle update": (lambda w, s, step, kl_ctl: s["minibatch_steps"] == 0,
                    lambda w, s, step, kl_ctl: idle_update_warning(s, step, w.cfg.target_kl), True),
    "cut off": (lambda w, s, step, kl_ctl: step - 1 == w.first_step and not w.cfg.env
                and w.cfg.penalize_missing_eos and s["eos_rate"] < 0.1,
                lambda w, s, step, kl_ctl: cut_off_warning(s, w.cfg), True),
    "kl": (lambda w, s, step, kl_ctl: w.kl_high == max(1, math.ceil(0.1 * w.cfg.max_iters))
           and s["kl"] > 2 * w.cfg.kl_target,
           lambda w, s, step, kl_ctl: kl_warning(s, w.cfg, w.kl_high, kl_ctl.value), False),
}


class RunWatch:
    """The warnings of one run (module docstring). `kl_high` (iterations whose KL passed twice
    the target) is saved with the checkpoint; `first_step` is this process's first iteration,
    resumed or not; `resume(history)` hands the hacking monitor and the stuck count the lines
    already logged. `best`: the most a response (or an episode) can earn, when the reward's
    source says (an environment's `best_return`), else None."""

    def __init__(self, cfg, best: float | None = None):
        self.cfg, self.best = cfg, best
        self.kl_high = 0
        self.first_step = 0
        self.said = set()  # the WARNINGS said once that have been said
        self.monitor = HackingMonitor(cfg.warning_window)
        self.scores = []  # every iteration's reward so far
        self.tied_from_start = True  # every group tied in every iteration so far
        self.stuck = 0  # iterations in a row without a reward signal, below the SFT level

    def resume(self, history: list[dict]) -> None:
        self.monitor = HackingMonitor(self.cfg.warning_window, history)
        for row in history:
            self.no_signal(row)

    @property
    def sft_level(self) -> float | None:
        """The SFT policy's reward: the mean of the first SFT_ITERATIONS iterations (None
        before there are that many)."""
        first = self.scores[:SFT_ITERATIONS]
        return sum(first) / len(first) if len(first) == SFT_ITERATIONS else None

    def no_signal(self, stats: dict) -> int:
        """Iterations in a row, this one included, in which no reward signal reached the policy
        (every group's rewards tied, or its entropy under 0.01 nats) while the iteration's reward
        was below the SFT level by more than a tenth of the range seen; or, in a run whose every
        group has tied since the first iteration, every iteration so far unless the reward is
        `best`. Else 0. (With the KL in the loss the KL's gradient still reaches a tied group:
        what is missing is the reward's.)"""
        score = stats["score"]
        self.scores.append(score)
        tied = stats.get("zero_groups", 0.0) >= 1.0
        silent = tied or stats["entropy"] < 0.01
        self.tied_from_start = self.tied_from_start and tied
        sft, spread = self.sft_level, max(self.scores) - min(self.scores)
        below_sft = sft is not None and sft - score > 0.1 * spread
        never_learned = self.tied_from_start and (self.best is None or score < self.best)
        self.stuck = self.stuck + 1 if silent and (below_sft or never_learned) else 0
        return self.stuck

    def check(self, stats: dict, step: int, kl_ctl) -> dict:
        """The figures to log with iteration `step` (the signals and hacking_warning); prints
        each warning whose time has come (on the main process). `kl_ctl`: the KL controller
        after the update (its beta for the KL warning, its bound)."""
        figures, message = self.monitor.update(stats, step)
        figures["stuck"] = self.no_signal(stats)
        self.kl_high += stats["kl"] > 2 * self.cfg.kl_target
        stats, lines = {**stats, **figures}, [message] if message else []
        for name, (due, line, once) in WARNINGS.items():
            if due(self, stats, step, kl_ctl) and name not in self.said:
                self.said |= {name} if once else set()
                lines.append(line(self, stats, step, kl_ctl))
        if is_main():
            for line in lines:
                tqdm.write(line)
        return figures
