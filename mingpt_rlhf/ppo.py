"""The math of PPO for language models, in the order you would teach it.

An episode is one response: the state is prompt + tokens so far, an action is the next token.
Everything below works on response-aligned tensors of shape (B, N): column i is the i-th
generated token, and `action_mask` (B, N) is 1 up to and including its EOS, 0 after it.

1. Log-probs of each taken token (`logprobs.py`): the logit at position t predicts token t + 1,
   so the response (columns T..T+N-1) is scored by the logits at T-1..T+N-2.
2. `kl_shaped_rewards`: r_t = -beta * (logp_t - ref_logp_t) on every response token (the k1
   estimate of the KL to the reference: only its expectation is >= 0), plus the reward
   model's score on the last real token (Ziegler et al. 2019; InstructGPT).
3. `gae` (Schulman et al. 2016), a reversed loop: delta_t = r_t + gamma * V_{t+1} - V_t,
   A_t = delta_t + gamma * lam * A_{t+1}, 0 past the last real token; returns = A + V.
4. `ReplayBuffer`: the rollouts, reshuffled into minibatches every epoch, cleared after the
   update (PPO is on-policy).
5. `policy_loss`: max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)), masked mean.
   `value_loss`: 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), masked mean.
6. `AdaptiveKLController`: log beta += clip(log(KL / target), -0.2, 1) / horizon per update.

Each is checked against a hand computation in tests/test_ppo.py; ppo_trainer.py strings them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from .machinery.distributed import all_sum
from .logprobs import token_logprobs  # noqa: F401  (part of the PPO math; tests import it here)


# ----------------------------------------------------------------------------- helpers
def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None, tokens=None) -> torch.Tensor:
    """Mean of `x` over the positions where `mask` is 1. `tokens` replaces the count of those
    positions as the divisor (see `distributed.tokens_per_rank`)."""
    if dim is None:
        return (x * mask).sum() / (mask.sum().clamp(min=1) if tokens is None else tokens)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8,
                  all_ranks: bool = False) -> torch.Tensor:
    """(x - mean) / std over the real positions; padding stays 0. eps keeps a tiny std finite.
    `all_ranks` (torchrun): the mean and std of the whole batch, from sums over the processes."""
    total = all_sum if all_ranks else (lambda t: t)
    count = total(mask.sum()).clamp(min=1)
    mean = total((x * mask).sum()) / count
    var = total(((x - mean) ** 2 * mask).sum()) / count
    return (x - mean) * torch.rsqrt(var + eps) * mask


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """(B,) column of each row's last real action (its EOS, or the last token generated)."""
    positions = torch.arange(action_mask.size(1), device=action_mask.device)
    return (action_mask.long() * positions).argmax(-1)


# ----------------------------------------------------------------------------- experience
@dataclass
class Experience:
    """One rollout batch. sequences/attention_mask are (B, T + N); the rest is (B, N) or (B,)."""
    sequences: torch.Tensor       # (B, T + N) left-padded prompt, then response
    attention_mask: torch.Tensor  # (B, T + N) 1 = real token
    action_mask: torch.Tensor     # (B, N) float, 1 = generated token up to and including EOS
    logprobs: torch.Tensor        # (B, N) log-probs under the policy that sampled (old policy)
    ref_logprobs: torch.Tensor    # (B, N) under the frozen reference (SFT) policy
    values: torch.Tensor          # (B, N) critic's values at sampling time (old values)
    rewards: torch.Tensor         # (B, N) KL-shaped rewards, score on the last real token
    advantages: torch.Tensor      # (B, N) GAE, whitened over real tokens
    returns: torch.Tensor         # (B, N) advantages (before whitening) + values
    scores: torch.Tensor          # (B,) reward-model score used (clipped; penalty if no EOS)
    # (B, N) the learner's own log-probs as the update starts: approx-KL (the early stop)
    # measures the update's move from them. They are `logprobs` itself unless an off-policy
    # correction takes the ratio against a lagging sampler (lab/offpolicy.py: clip, gspo)
    start_logprobs: torch.Tensor | None = None

    def __post_init__(self):
        if self.start_logprobs is None:
            self.start_logprobs = self.logprobs

    @property
    def prompt_len(self) -> int:
        return self.sequences.size(1) - self.action_mask.size(1)

    def select(self, idx: torch.Tensor) -> "Experience":
        return Experience(*(getattr(self, f.name)[idx] for f in fields(self)))

    def trimmed(self) -> "Experience":
        """Drop the columns that are padding in every row: prompt pads on the left, response
        pads on the right. A minibatch of short responses then costs what its tokens cost."""
        real = self.attention_mask.any(0).nonzero()
        left = int(real[0]) if len(real) else 0
        acted = self.action_mask.any(0).nonzero()
        n = int(acted[-1]) + 1 if len(acted) else self.action_mask.size(1)
        end = self.prompt_len + n

        def cut(name, x):  # (B, T + N) keeps columns left..end, (B, N) the first n, (B,) all
            return x[:, left:end] if name in ("sequences", "attention_mask") else x[:, :n] if x.dim() == 2 else x
        return Experience(**{f.name: cut(f.name, getattr(self, f.name)) for f in fields(self)})


def align_and_cat(batches: list[Experience], pad_id: int) -> Experience:
    """Concatenate rollout batches whose prompt width T or response width N differ: prompts are
    padded further on the left, responses further on the right, so that every row's response
    starts in the same column again."""
    T = max(b.prompt_len for b in batches)
    N = max(b.action_mask.size(1) for b in batches)
    parts = {f.name: [] for f in fields(Experience)}
    for b in batches:
        left, right = T - b.prompt_len, N - b.action_mask.size(1)
        parts["sequences"].append(F.pad(b.sequences, (left, right), value=pad_id))
        parts["attention_mask"].append(F.pad(b.attention_mask, (left, right)))
        for name in ["action_mask", "logprobs", "ref_logprobs", "values", "rewards",
                     "advantages", "returns", "start_logprobs"]:
            parts[name].append(F.pad(getattr(b, name), (0, right)))
        parts["scores"].append(b.scores)
    return Experience(**{k: torch.cat(v) for k, v in parts.items()})


# ----------------------------------------------------------------------------- rewards, GAE
def kl_shaped_rewards(scores, logprobs, ref_logprobs, action_mask, kl_coef: float,
                      estimator=None):
    """(B, N) rewards: -kl_coef * (logp - ref_logp) per token, + score on the last real token.
    `scores` (B,), or (B, N) rewards already placed (an episode's). `estimator(logprobs,
    ref_logprobs) -> (B, N)` charges another estimate of the KL (losses.KL_ESTIMATORS)."""
    kl = logprobs - ref_logprobs if estimator is None else estimator(logprobs, ref_logprobs)
    rewards = -kl_coef * kl * action_mask
    if scores.dim() == 2:
        return rewards + scores * action_mask
    last = last_action_index(action_mask)
    rewards[torch.arange(len(scores)), last] += scores
    return rewards


def penalize_missing_eos(scores, ended, lengths, cfg):
    """(B,) scores where a response cut off by max_new_tokens (`ended` False) gets
    cfg.missing_eos_penalty instead of the reward's opinion of a half-written text."""
    return torch.where(ended, scores, torch.full_like(scores, cfg.missing_eos_penalty))


def gae(rewards, values, action_mask, gamma: float = 1.0, lam: float = 0.95):
    """(advantages, returns), both (B, N), 0 wherever `action_mask` is 0.

    The loop steps over masked positions: padding after the last action (and an environment's
    tokens between two turns: methods/episodes.py), so the last action bootstraps from V = 0."""
    acted = action_mask.bool()
    rewards, values = rewards * action_mask, values * action_mask
    N = rewards.size(1)
    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(N)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = adv
        # a hole leaves the carried value and advantage as they were
        next_adv = torch.where(acted[:, t], adv, next_adv)
        next_value = torch.where(acted[:, t], values[:, t], next_value)
    advantages = advantages * action_mask
    return advantages, (advantages + values) * action_mask


# ----------------------------------------------------------------------------- replay buffer
class ReplayBuffer:
    """Rollout batches split into items (rows); yields shuffled minibatches of items."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id
        self.batches: list[Experience] = []
        self.items: Experience | None = None

    def add(self, experience: Experience) -> None:
        self.batches.append(experience)
        self.items = None

    def __len__(self) -> int:
        return sum(len(b.scores) for b in self.batches)

    def minibatches(self, size: int, generator: torch.Generator | None = None, unit: int = 1):
        """One epoch: every item exactly once, in a fresh random order (the last minibatch is
        smaller when `size` does not divide the number of items). `unit` > 1 keeps runs of that
        many consecutive items together."""
        if len(self) == 0:
            return
        if self.items is None:
            self.items = align_and_cat(self.batches, self.pad_id)
        order = torch.randperm(len(self) // unit, generator=generator)
        order = (order[:, None] * unit + torch.arange(unit)).flatten().to(self.items.scores.device)
        for i in range(0, len(self), size):
            yield self.items.select(order[i:i + size]).trimmed()

    def clear(self) -> None:
        self.batches, self.items = [], None


def rollout_figures(rolled: list[dict]) -> dict:
    """One iteration's figures from its rollouts': the mean of each, the sum of each cost."""
    stats = {k: sum(s[k] for s in rolled) / len(rolled) for k in rolled[0]}
    for k in ("t_generate", "t_score", "gen_tokens"):  # costs: summed over the rollouts
        stats[k] = sum(s[k] for s in rolled)
    return stats


# ----------------------------------------------------------------------------- losses
def _token_mean(x, action_mask, budget, tokens):
    return masked_mean(x, action_mask, tokens=tokens)


def _sequence_mean(x, action_mask, budget, tokens):
    per_seq = (x * action_mask).sum(-1) / action_mask.sum(-1).clamp(min=1)  # (B,)
    return per_seq.mean()


def _budget_sum(x, action_mask, budget, tokens):
    return ((x * action_mask).sum(-1) / budget).mean()


# how per-token losses (B, N) become one scalar, over real tokens only (`reduce_tokens`)
REDUCTIONS = {"token": _token_mean, "sequence": _sequence_mean, "budget": _budget_sum}


def reduce_tokens(x, action_mask, how: str = "token", budget: int | None = None, tokens=None):
    """One scalar from per-token losses (B, N), over real tokens only (`REDUCTIONS[how]`):
    "token" is PPO's mean over every real token of the minibatch, dividing by `tokens` when given
    (`distributed.tokens_per_rank`); "sequence" and "budget" are GRPO's and Dr. GRPO's
    (docs/fork_it.md, "The roles")."""
    if how not in REDUCTIONS:
        raise ValueError(f"unknown reduction {how!r}")
    return REDUCTIONS[how](x, action_mask, budget, tokens)


def policy_loss(logprobs, old_logprobs, advantages, action_mask, clip_range: float = 0.2,
                how: str = "token", budget: int | None = None, tokens=None,
                clip_high: float | None = None):
    """Clipped surrogate loss (reduced as `reduce_tokens(how)`) and clipfrac, the share of
    tokens whose clipped branch was taken. `clip_high`: an upper clip of 1 + clip_high
    (DAPO's clip-higher) instead of 1 + clip_range."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    high = clip_range if clip_high is None else clip_high
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_range, 1 + high)
    loss = reduce_tokens(torch.max(unclipped, clipped), action_mask, how, budget, tokens)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), action_mask, tokens=tokens)
    return loss, clipfrac


def approx_kl(logprobs, start_logprobs, action_mask, tokens=None) -> torch.Tensor:
    """How far an update has moved the policy from where it started, per token: the k3
    estimate (r - 1) - log r of KL(start || now), r = pi / pi_start, >= 0, a mean over real
    tokens. The early stop on --target_kl reads it. No gradient."""
    with torch.no_grad():
        log_ratio = torch.where(action_mask.bool(), logprobs - start_logprobs, 0.0)
        return masked_mean(torch.exp(log_ratio) - 1 - log_ratio, action_mask, tokens=tokens)


def value_loss(values, old_values, returns, action_mask, clip_range: float = 0.2, tokens=None):
    """Clipped value loss, a mean over real tokens: 0.5 * max((V - R)^2, (clip(V) - R)^2),
    V clipped to within clip_range of the old values. Not a bound on how far a value moves:
    docs/details.md, item 10."""
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    loss = torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, action_mask, tokens=tokens)


def explained_variance(values, returns, action_mask) -> float:
    """1 - Var(returns - values) / Var(returns) over real tokens: 1 = perfect critic, 0 = none."""
    var_returns = masked_mean((returns - masked_mean(returns, action_mask)) ** 2, action_mask)
    diff = returns - values
    var_diff = masked_mean((diff - masked_mean(diff, action_mask)) ** 2, action_mask)
    return (1 - var_diff / var_returns.clamp(min=1e-8)).item()


# ----------------------------------------------------------------------------- KL coefficient
class FixedKLController:
    high = math.inf  # (AdaptiveKLController's upper bound: a fixed beta has none to reach)

    def __init__(self, kl_coef: float):
        if kl_coef < 0:  # -1 is train_ppo.Config's "auto", which ppo_trainer.resolve_auto_options resolves
            raise ValueError(f"a fixed KL coefficient must be >= 0, got {kl_coef} (resolve the config's "
                             f"\"auto\" options first)")
        self.value = kl_coef

    def update(self, kl: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Steer the KL per response (nats, summed over response tokens) towards `target`.

    Ziegler et al. (2019) move beta by a clipped proportional error times n_samples / horizon,
    with a horizon of 10,000 samples; a run of ours sees ~13,000 samples, so beta could move
    only ~25 % in a whole run. Here the horizon counts *iterations* (one update each) and the
    error is measured in log-space, where "twice the target" and "half the target" weigh the
    same:

        log beta += clip(log(KL / target), DOWN, UP) / horizon

    The clip is asymmetric on purpose. The KL is not a function of today's beta: it is how far
    the policy has drifted, and drift takes many updates to undo. A controller that lowers beta
    as fast as it raises it keeps lowering it all the time the policy is still below target
    and drifting up, then overshoots (integral windup). So beta rises fast when the KL is
    above target (up to x e^(UP / horizon) per update, ~10 % at horizon 10) and falls slowly
    when it is below (at most x e^(DOWN / horizon), ~2 %). tests/test_kl_control.py measures
    both on simulated runs.

    Beta is bounded to [kl_coef / RANGE, kl_coef x RANGE]. Unbounded, the integral winds up:
    a run that collapses (KL 45 nats per response against a target of 3, for 180 iterations)
    raises beta x1.105 an iteration, to 10^7, and when the policy comes back that beta pins it
    to the reference for the rest of the run (falling 2 % an iteration, it would need ~860
    iterations to return). RANGE = 10 lies past the built-in task's runs (beta ended at 0.38x
    to 7.2x its start over --kl_target 1 to 6, bench/results/kl_control.json), and from the
    upper bound beta is back within 2x of its start in 81 iterations at horizon 10. When beta
    is held at `high` the run warns once. The lower bound keeps a beta that fell for long from
    needing as long to rise again, and keeps a tenth of the --kl_coef a user chose; a run
    whose KL stays below target for hundreds of iterations rests on it (the example games'
    GRPO runs do: bench/kl_bound_cost.py measures what that costs them).
    """

    UP, DOWN = 1.0, -0.2
    RANGE = 10.0

    def __init__(self, kl_coef: float, target: float, horizon: float):
        if kl_coef <= 0 or target <= 0 or horizon <= 0:
            raise ValueError("adaptive KL needs kl_coef > 0, target > 0 and horizon > 0")
        self.value, self.target, self.horizon = kl_coef, target, horizon
        self.low, self.high = kl_coef / self.RANGE, kl_coef * self.RANGE

    def update(self, kl: float) -> None:
        error = math.log(max(kl, 1e-8) / self.target)
        moved = self.value * math.exp(min(max(error, self.DOWN), self.UP) / self.horizon)
        self.value = min(max(moved, self.low), self.high)

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        # (a checkpoint from before the bound may hold a wound-up beta)
        self.value = min(max(state["value"], self.low), self.high)
