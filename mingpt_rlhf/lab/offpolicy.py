"""Stale samples: a sampler that runs behind the learner, and the corrections for it, by name.

An asynchronous trainer lets its sampler write the next batches while the learner trains on
the last ones, so each batch was written by weights some updates old: the samples come from
a policy mu (the sampler) that is not the policy pi learning from them. `--sampler_lag N`
reproduces that lag in one process, deterministically: each rollout is sampled with the
weights of N updates ago (`SamplerQueue`, N copies of the trainable weights; with LoRA only
the adapters), and the learner scores the batch itself, so each token has two log-probs, the
sampler's (log mu) and the learner's at the start of the update (log pi_prox, the
"proximal" policy). What to do with the gap is one choice, a table of entries of one
signature, f(learner, sampler, action_mask, cap) -> (old_logprobs, weights):

- none       the ratio against the learner's own pass, no weight: the stale batch is taken as
             if the learner had sampled it (what an asynchronous trainer does unawares);
- clip       the ratio and its clip against the sampler (PPO as written, with mu as the old
             policy): the clip bounds pi / mu, so tokens already far from the sampler get no
             gradient, wherever the learner is;
- decoupled  AReaL's decoupled objective (Hilton et al.'s, for PPO-EWMA): the clip against
             the proximal policy, the surrogate weighed by pi_prox / mu (capped at `cap` when
             it is > 0): the trust region follows the learner, the weight corrects the data;
- tis        truncated importance sampling (Yao et al.): the same, the weight always capped,
             min(pi_prox / mu, cap): a token the sampler rarely wrote cannot dominate;
- mask       masking the tokens whose weight runs away, as IcePop does (and DeepSeek-V3.2's
             masking of off-policy samples in spirit): pi_prox / mu inside [1 / cap, cap]
             keeps its weight, outside it the token is dropped (weight 0);
- gspo       GSPO's sequence ratio against the sampler: one ratio per response, the geometric
             mean of its tokens' pi / mu, clipped per response (the trainer's --ratio
             sequence, with mu as the old policy).

Every weight is a constant >= 0 per token, so weighing the clipped surrogate by it is the same
as multiplying the token's advantage by it, which is how the trainer applies it (losses.py).
None corrects the KL term when it is in the loss, nor the logged KL, nor the prefix: a
per-token weight corrects the distribution of the token given its prefix, not the
probability of reaching the prefix (that would take the product of the ratios before it,
whose variance grows with the length). The gradient oracle (lab/gradients.py) has a row for each
entry at a lagging sampler; tests/test_offpolicy.py checks each against a hand computation.
"""
from __future__ import annotations

import contextlib
from collections import deque
from typing import NamedTuple

import torch

from ..ppo import masked_mean


class Correction(NamedTuple):
    old_logprobs: torch.Tensor          # (B, N) the ratio's denominator
    weights: torch.Tensor | None        # (B, N) >= 0, multiplies the advantages; None = 1


def _ratio(learner, sampler, action_mask):
    """pi_prox / mu per token (1 off the mask)."""
    return torch.exp((learner - sampler) * action_mask)


def _none(learner, sampler, action_mask, cap):
    return Correction(learner, None)


def _clip(learner, sampler, action_mask, cap):
    return Correction(sampler, None)


def _decoupled(learner, sampler, action_mask, cap):
    r = _ratio(learner, sampler, action_mask)
    return Correction(learner, r.clamp(max=cap) if cap > 0 else r)


def _tis(learner, sampler, action_mask, cap):
    return Correction(learner, _ratio(learner, sampler, action_mask).clamp(max=cap))


def _mask(learner, sampler, action_mask, cap):
    r = _ratio(learner, sampler, action_mask)
    return Correction(learner, torch.where((r >= 1 / cap) & (r <= cap), r, 0.0))


OFFPOLICY = {"none": _none, "clip": _clip, "decoupled": _decoupled, "tis": _tis,
             "mask": _mask, "gspo": _clip}
MAX_LAG = 8                           # --sampler_lag 0 .. MAX_LAG
READS_CAP = ("decoupled", "tis", "mask")  # the entries that weigh tokens: --tis_cap bounds them
NEEDS_CAP = ("tis", "mask")           # their cap has no "off"
DEFAULT_CAP = 2.0                     # Yao et al.'s C; the mask keeps [0.5, 2]


def resolved_offpolicy(cfg) -> str:
    """The run's entry of OFFPOLICY: --offpolicy, whose "auto" (and a caller's config without
    the option) is tis when --tis_cap is set, else none."""
    name = getattr(cfg, "offpolicy", "auto")
    if name == "auto":
        return "tis" if getattr(cfg, "tis_cap", 0.0) > 0 else "none"
    return name


def cap_of(cfg) -> float:
    """The cap C the run's correction uses: --tis_cap, or DEFAULT_CAP for an entry that needs
    one when it is 0 (for decoupled, 0 means no cap)."""
    cap = getattr(cfg, "tis_cap", 0.0)
    return cap if cap > 0 or resolved_offpolicy(cfg) not in NEEDS_CAP else DEFAULT_CAP


def correct(name: str, learner, sampler, action_mask, cap: float) -> tuple[Correction, dict]:
    """(Correction, figures) of entry `name` on (B, N) log-probs. figures, over real tokens:
    mismatch_kl, the k3 estimate (r - 1) - log r of KL(mu || pi_prox) per token, r = pi_prox
    / mu; mismatch_abs, the mean |log r|; is_cut, the share of tokens whose weight the cap
    cut or the mask dropped."""
    out = OFFPOLICY[name](learner, sampler, action_mask, cap)
    log_r = (learner - sampler) * action_mask
    r = torch.exp(log_r)
    cut = torch.zeros_like(r)
    if out.weights is not None:
        cut = (out.weights != r).float()
    figures = {"mismatch_kl": masked_mean((r - 1) - log_r, action_mask).item(),
               "mismatch_abs": masked_mean(log_r.abs(), action_mask).item(),
               "is_cut": masked_mean(cut, action_mask).item()}
    weights = None if out.weights is None else torch.where(action_mask.bool(), out.weights, 1.0)
    return Correction(out.old_logprobs, weights), figures


class SamplerQueue:
    """The weights the sampler uses with `--sampler_lag lag`: copies of the actor's trainable
    tensors after each of the last `lag` updates. Before update k (the weights then: theta_k)
    the rollout is sampled with `oldest()`, theta_{k - lag} (theta_0 while the queue fills,
    as an asynchronous run starts from fresh weights), then theta_k is `push`ed and the copy
    no longer needed is dropped: at most `lag` copies are held."""

    def __init__(self, lag: int):
        self.lag = lag
        self.copies: deque[list[torch.Tensor]] = deque()

    @contextlib.contextmanager
    def sampling(self, actor, for_update: bool):
        """The actor as the sampler of a training rollout: its weights of `lag` updates ago,
        swapped in, and back out after (an eval samples with the current weights)."""
        stale = self.oldest()
        if not (for_update and stale is not None):
            yield
            return
        params = [p for p in actor.parameters() if p.requires_grad]
        assert len(params) == len(stale) and all(
            p.shape == old.shape for p, old in zip(params, stale)), "stale weights of another model"
        now = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                for p, old in zip(params, stale):
                    p.copy_(old)
            yield
        finally:
            with torch.no_grad():
                for p, new in zip(params, now):
                    p.copy_(new)

    def oldest(self) -> list[torch.Tensor] | None:
        """theta_{k - lag}, or None when the queue is empty (the current weights sample)."""
        return self.copies[0] if self.copies else None

    def push(self, params) -> None:
        """Keep a copy of `params` (the weights before this update); drop what the next
        rollout will not need."""
        if self.lag == 0:
            return
        if len(self.copies) == self.lag:
            self.copies.popleft()
        self.copies.append([p.detach().clone() for p in params])

    def state(self) -> list[list[torch.Tensor]]:
        return list(self.copies)

    def load(self, copies, shapes: list[torch.Size]) -> bool:
        """Restore a checkpoint's queue; False when its tensors do not fit `shapes` (another
        model) or it holds more copies than `lag`. A checkpoint from before the queue held
        one list of tensors (lag 1)."""
        if copies and isinstance(copies[0], torch.Tensor):
            copies = [copies]
        copies = list(copies or [])
        if len(copies) > self.lag or any([t.shape for t in c] != shapes for c in copies):
            return False
        self.copies = deque(copies)
        return True
