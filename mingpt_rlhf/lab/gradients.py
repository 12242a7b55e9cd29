"""The gradient oracle: the direction every configuration of the trainer pushes the policy, exactly.

A language model's RL loss is a function of samples; what moves the policy is its gradient
*in expectation over the samples*, and a test of a loss's value on a few tensors never sees
that direction. In the enumerable world of lab/tabular.py every batch of responses can be
listed with its probability, so the expected gradient of the trainer's own loss (losses.py:
the advantages, the surrogate, the reduction, the KL estimator where it is placed) is a
finite sum, computed exactly in float64 (`expected_update`). Beside it, the gradient of the
objective the method claims, J = E[r] - beta KL(pi || ref), and for the biased
configurations the closed form of what they follow instead (FOLLOWS).

ROWS holds one configuration for each entry of every table of losses.py (a test checks that
none is missing); `exact_ascent` follows a row's expected update from the reference until it
stops, to see where it ends: at pi*, the maximiser of J, or elsewhere.

    python -m mingpt_rlhf.lab.gradients     # the table of every row (bench/results/gradients.json)
    python -m mingpt_rlhf.lab.gradients --markdown   # docs/gradients.md's table, from the JSON
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..machinery.cli import opt, run
from ..logprobs import sequence_logprobs
from ..losses import KL_ESTIMATORS, LossSpec, actor_loss, experience_advantages
from ..ppo import gae
from .offpolicy import correct
from .tabular import (CHOICES, MAX_LEN, PAD, PREFIX_INDEX, PREFIXES, RESPONSES, TabularPolicy,
                      World, conditionals, kl, make_world, objective, objective_gradient,
                      optimal_policy, optimal_value, response_batch, response_logprobs,
                      visits)


# ----------------------------------------------------------------------------- the oracle
@dataclass(frozen=True)
class Row:
    """One configuration of the trainer, as the oracle runs it.

    spec: the entry of each role (losses.LossSpec). batch: responses per batch, a group for
    the group estimators; the oracle lists every ordered batch of `batch` responses drawn
    independently from the sampler, |Y|^batch of them, each weighed by its probability.
    sampler: "current" (the first minibatch: the policy that learns sampled the batch, ratio
    1), "behind" (a later minibatch: batch, stored log-probs and advantages come from the
    policy one update behind, so the ratio and its clip are at work) or "lagging" (an
    asynchronous sampler one update behind; the learner scored the batch, as with
    --sampler_lag 1, corrected by the entry `correction` of offpolicy.OFFPOLICY with its
    `cap`, as --offpolicy and --tis_cap). values (gae only): "exact" (the value of each
    prefix under the sampler, of the rewards the trainer makes) or "arbitrary" (fixed random
    numbers). whiten False: gae's advantages before the whitening the trainer applies (a
    component, not a configuration: what the whitening changes is the difference)."""
    name: str
    spec: LossSpec
    batch: int = 3
    sampler: str = "current"
    values: str = "exact"
    correction: str = "none"
    cap: float = 0.0
    whiten: bool = True
    follows: str | None = None   # the closed form (FOLLOWS) its update equals, times `scale`
    scale: float = 1.0
    world: str = "task"          # "teacher": on-policy distillation's world (`world_of`)


def world_of(row: Row, world: World) -> World:
    """The world a row learns in: the task's, or for distillation (row.world "teacher") the
    teacher in the reference's place, no reward and beta 1, so that J = -KL(pi || teacher).
    The teacher is the task's pi*, the policy the task's KL-regularised RL would reach; the
    student still starts from the task's reference. (The teacher world's own pi* is the
    teacher: applied twice, this gives the same world.)"""
    if row.world != "teacher":
        return world
    return World(optimal_policy(world), torch.zeros_like(world.reward), 1.0)


def _prefix_values(sampler_logp, rewards, action_mask):
    """(Y, N) value of the prefix before each token, under the sampler: the expected sum of
    the rewards from that token on, over the responses that share the prefix."""
    prob = sampler_logp.exp()                                          # (Y,)
    to_go = rewards.flip(-1).cumsum(-1).flip(-1)                       # (Y, N) rewards from t on
    values = torch.zeros_like(rewards)
    for i, y in enumerate(RESPONSES):
        for t in range(len(y)):
            through = [j for j, z in enumerate(RESPONSES) if z[:t] == y[:t]]
            mass = prob[through]
            values[i, t] = (mass * to_go[through, t]).sum() / mass.sum()
    return values * action_mask


def arbitrary_values(seed: int = 7) -> torch.Tensor:
    """(Y, N) a critic that knows nothing: a fixed random value per prefix."""
    gen = torch.Generator().manual_seed(seed)
    per_prefix = torch.randn(len(PREFIXES), generator=gen, dtype=torch.float64)
    _, _, action_mask = response_batch()
    values = torch.tensor([[per_prefix[PREFIX_INDEX[y[:t]]].item() if t < len(y) else 0.0
                            for t in range(MAX_LEN)] for y in RESPONSES])
    return values * action_mask


def expected_update(row: Row, table: torch.Tensor, world: World,
                    behind: torch.Tensor | None = None, coin: bool = False) -> torch.Tensor:
    """(P, V) the direction the trainer moves the table in expectation: minus the gradient of
    the expected loss over every batch the sampler can draw, at the learner's `table`
    (`behind`: the policy one update earlier, for the samplers other than "current").
    `coin`: each response's reward a fair coin (0 or 1) of its own instead of the world's r(y),
    every outcome of the batch's coins listed too (a random reward: lab/spurious.py); rows
    without a critic only.

    The loss of each batch is the trainer's own, from losses.py: `experience_advantages`
    (the KL penalty, the advantages, TIS weights) on the sampler's numbers, then
    `actor_loss` on the learner's log-probs. Log-probs come from the package's
    `sequence_logprobs` on the tabular policy, as the trainer computes them."""
    spec, world = row.spec, world_of(row, world)
    sequences, attention_mask, action_mask = response_batch()
    theta = table.detach().clone().requires_grad_(True)

    def scored(model, entropy=None):
        return sequence_logprobs(model, sequences, attention_mask, 1, suppress=PAD,
                                 entropy=entropy)

    logprobs, entropy = scored(TabularPolicy.of(theta), "grad")
    with torch.no_grad():
        ref = scored(TabularPolicy(world.ref))[0] * action_mask
        now = logprobs.detach() * action_mask
        before = scored(TabularPolicy(behind))[0] * action_mask if behind is not None else now
    weights = None
    if row.sampler == "current":
        sampler, stored = now, now          # stored: the learner's log-probs at scoring time
    elif row.sampler == "behind":
        sampler, stored = before, before
    elif row.sampler == "lagging":
        sampler, stored = before, now
        (old, weights), _ = correct(row.correction, now, before, action_mask, row.cap)
    else:
        raise ValueError(f"unknown sampler {row.sampler!r}")
    if row.sampler != "lagging":
        old = stored                        # the ratio's denominator
    placed = torch.zeros_like(action_mask)
    placed[torch.arange(len(RESPONSES)), action_mask.sum(-1).long() - 1] = world.reward
    if coin and spec.advantages == "gae":
        raise ValueError("coin rewards are for the rows without a critic")
    if spec.advantages == "gae" and row.values == "exact":
        penalty = (KL_ESTIMATORS[spec.kl_estimator](stored, ref) * action_mask
                   if spec.kl_in == "reward" else 0.0)
        values = _prefix_values(sampler.sum(-1), placed - world.beta * penalty, action_mask)
    elif spec.advantages == "gae":
        values = arbitrary_values()
    else:
        values = torch.zeros_like(action_mask)

    # every ordered batch: (Y^n, n) indices into RESPONSES, and its probability
    index = torch.cartesian_prod(*[torch.arange(len(RESPONSES))] * row.batch).view(-1, row.batch)
    prob = sampler.sum(-1).exp()[index].prod(-1)                       # (Y^n,)
    batch_placed = placed[index]                                       # (Y^n, n, N)
    if coin:  # every batch once per outcome of its n coins, each outcome 1 / 2^n likely
        flips = torch.cartesian_prod(*[torch.tensor([0.0, 1.0], dtype=torch.float64)] * row.batch)
        flips = flips.view(-1, row.batch)                              # (2^n, n)
        index = index.repeat_interleave(len(flips), 0)
        prob = prob.repeat_interleave(len(flips)) / len(flips)
        last = (torch.arange(MAX_LEN) == action_mask.sum(-1, keepdim=True) - 1).double()
        batch_placed = last[index] * flips.repeat(len(index) // len(flips), 1)[..., None]

    def batch_loss(lp, ent, old, ref_lp, stored_lp, value, place, mask, weight):
        if row.whiten:
            _, advantages, _ = experience_advantages(place, stored_lp, ref_lp, value, mask, spec,
                                                     world.beta, True,
                                                     weight if weights is not None else 1.0,
                                                     ent.detach())
        else:  # the component: gae's advantages as they are before the whitening
            rewards = place
            if spec.kl_in == "reward":
                rewards = place - world.beta * KL_ESTIMATORS[spec.kl_estimator](stored_lp, ref_lp) * mask
            advantages, _ = gae(rewards, value, mask, spec.gamma, spec.lam)
        loss, _ = actor_loss(lp, ent, old, ref_lp, advantages, mask, spec, world.beta, MAX_LEN)
        return loss

    ones = torch.ones_like(action_mask)
    losses = torch.vmap(batch_loss)(
        logprobs[index], entropy[index], old[index], ref[index], stored[index],
        values[index], batch_placed, action_mask[index],
        (weights if weights is not None else ones)[index])
    (grad,) = torch.autograd.grad((prob * losses).sum(), theta)
    return -grad


# ----------------------------------------------------------------------------- what rows follow
def _grad(fn, table):
    theta = table.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(theta), theta)
    return grad


def reward_gradient(table, world):
    """grad E_pi[r]: the objective without its KL (beta = 0)."""
    return objective_gradient(table, World(world.ref, world.reward, 0.0))


def estimate_sums(table, world, estimator: str) -> torch.Tensor:
    """(Y,) each response's sum of an estimator's per-token values (k1, k2, k3 of
    KL(pi || ref)), from the tables; written apart from losses.KL_ESTIMATORS on purpose."""
    cond, ref = conditionals(table), conditionals(world.ref)
    sums = []
    for choices in CHOICES:
        d = torch.stack([cond[p, tok] - ref[p, tok] for p, tok in choices])
        per_token = {"k1": d, "k2": d ** 2 / 2, "k3": torch.exp(-d) + d - 1}[estimator]
        sums.append(per_token.sum())
    return torch.stack(sums)


def semi_gradient(table, world, estimator: str):
    """grad of E_pi[r - beta K] with K, the response's summed estimates, held fixed: what a
    penalty in the reward follows (REINFORCE sees the penalty as a number, not a function of
    the policy). With k1 it is grad J exactly (E_pi[grad log pi] = 0 takes K's own gradient
    away); with k2 or k3 it is the gradient of no fixed objective."""
    shaped = (world.reward - world.beta * estimate_sums(table, world, estimator)).detach()
    return _grad(lambda theta: (response_logprobs(theta).exp() * shaped).sum(), table)


def local_kl_gradient(table, world, direction: str):
    """grad of sum_p w(p) KL_p, with w(p) the probability of reaching prefix p held fixed
    and KL_p the KL of the next-token distributions at p: "reverse" KL(pi_p || ref_p), what
    k2 in the loss follows, or "forward" KL(ref_p || pi_p), what k3 in the loss follows.
    The KL of whole responses is sum_p w(p) KL_p too, but its gradient also moves w(p):
    a token's choice changes which prefixes come later; a per-token loss misses that share."""
    weight = visits(table).detach()

    def summed(theta):
        logp = torch.log_softmax(theta[:, 1:], -1)
        logr = torch.log_softmax(world.ref[:, 1:], -1)
        per_prefix = ((logp.exp() * (logp - logr)).sum(-1) if direction == "reverse"
                      else (logr.exp() * (logr - logp)).sum(-1))
        return (weight * per_prefix).sum()
    return _grad(summed, table)


# closed forms of what a row's expected update equals, up to the row's `scale`
FOLLOWS = {
    "grad J": objective_gradient,
    "grad E[r]": reward_gradient,
    "semi-gradient, k2 in the reward": lambda t, w: semi_gradient(t, w, "k2"),
    "semi-gradient, k3 in the reward": lambda t, w: semi_gradient(t, w, "k3"),
    "grad E[r] - beta x local KL(pi || ref)":
        lambda t, w: reward_gradient(t, w) - w.beta * local_kl_gradient(t, w, "reverse"),
    "grad E[r] - beta x local KL(ref || pi)":
        lambda t, w: reward_gradient(t, w) - w.beta * local_kl_gradient(t, w, "forward"),
}


# ----------------------------------------------------------------------------- the rows
GROUP = 3                          # responses per batch: a group for the group estimators


def _spec(**options) -> LossSpec:
    return LossSpec(**{"group_size": GROUP, **options})


_RLOO = dict(advantages="rloo", reduction="budget")
ROWS = [
    # advantage estimators and reductions, on the first minibatch (ratio 1), k1 in the reward
    Row("ppo (gae with exact values, whitened, token mean)", _spec(advantages="gae")),
    Row("ppo, arbitrary critic", _spec(advantages="gae"), values="arbitrary"),
    Row("gae before whitening, exact values", _spec(advantages="gae", reduction="budget"),
        whiten=False, follows="grad J", scale=1 / MAX_LEN),
    Row("gae before whitening, arbitrary critic, lambda 1",
        _spec(advantages="gae", reduction="budget", lam=1.0), values="arbitrary", whiten=False,
        follows="grad J", scale=1 / MAX_LEN),
    Row("gae before whitening, arbitrary critic, lambda 0.95",
        _spec(advantages="gae", reduction="budget"), values="arbitrary", whiten=False),
    Row("reinforce++ (returns whitened over the batch, token mean)",
        _spec(advantages="reinforce++")),
    Row("grpo as published (std, sequence mean, k3 in the loss)",
        _spec(advantages="grpo", reduction="sequence", kl_in="loss", kl_estimator="k3")),
    Row("grpo std, budget, k3 in the loss",
        _spec(advantages="grpo", reduction="budget", kl_in="loss", kl_estimator="k3")),
    Row("dr grpo (budget, k1 in the reward)", _spec(advantages="dr_grpo", reduction="budget"),
        follows="grad J", scale=(GROUP - 1) / GROUP / MAX_LEN),
    Row("dr grpo advantages, sequence mean", _spec(advantages="dr_grpo", reduction="sequence")),
    Row("rloo advantages, token mean", _spec(advantages="rloo", reduction="token")),
    # the six KL configurations, on rloo (budget): the estimator in the reward or in the loss
    Row("k1 in the reward (rloo)", _spec(**_RLOO), follows="grad J", scale=1 / MAX_LEN),
    Row("k2 in the reward (rloo)", _spec(**_RLOO, kl_estimator="k2"),
        follows="semi-gradient, k2 in the reward", scale=1 / MAX_LEN),
    Row("k3 in the reward (rloo)", _spec(**_RLOO, kl_estimator="k3"),
        follows="semi-gradient, k3 in the reward", scale=1 / MAX_LEN),
    Row("k1 in the loss (rloo)", _spec(**_RLOO, kl_in="loss", kl_estimator="k1"),
        follows="grad E[r]", scale=1 / MAX_LEN),
    Row("k2 in the loss (rloo)", _spec(**_RLOO, kl_in="loss", kl_estimator="k2"),
        follows="grad E[r] - beta x local KL(pi || ref)", scale=1 / MAX_LEN),
    Row("k3 in the loss (rloo)", _spec(**_RLOO, kl_in="loss", kl_estimator="k3"),
        follows="grad E[r] - beta x local KL(ref || pi)", scale=1 / MAX_LEN),
    Row("entropy bonus 0.1 (rloo)", _spec(**_RLOO, entropy_coef=0.1)),
    Row("the top half of the batch's tokens by entropy learn (rloo)",
        _spec(**_RLOO, learn_tokens="top_entropy", top_entropy_quantile=0.5)),
    Row("only the wrong answers learn: score below the group's (rloo)",
        _spec(**_RLOO, learn_tokens="negative")),
    # the corrections, with a sampler one update behind the learner
    Row("ppo clip 0.2, a later minibatch (rloo)", _spec(**_RLOO), sampler="behind"),
    Row("clip-higher 0.2 / 0.28, a later minibatch (rloo)", _spec(**_RLOO, clip_high=0.28),
        sampler="behind"),
    Row("gspo clip 0.1, a later minibatch (rloo)",
        _spec(advantages="rloo", reduction="sequence", policy_loss="sequence", clip_range=0.1,
              clip_high=0.1), sampler="behind"),
    # the entropy mechanism's losses (lab/entropy.py), where they act: a later minibatch
    Row("clip-cov, a fifth of the tokens from the band [0, 5] (rloo)",
        _spec(**_RLOO, policy_loss="clip_cov", cov_ratio=0.2, clip_cov_low=0.0), sampler="behind"),
    Row("kl-cov, a fifth of the tokens, coef 1 (rloo)",
        _spec(**_RLOO, policy_loss="kl_cov", cov_ratio=0.2, kl_cov_coef=1.0), sampler="behind"),
    # on-policy distillation (methods/distill.py): the teacher in the reference's place, no
    # score, beta 1; J = -KL(pi || teacher)
    Row("distill, sequence form (rloo's baseline): reverse KL of whole responses",
        _spec(advantages="distill", reduction="budget"), world="teacher", follows="grad J",
        scale=1 / MAX_LEN),
    Row("distill, token form (each token's own reward)",
        _spec(advantages="distill_token", reduction="budget"), world="teacher",
        follows="grad E[r] - beta x local KL(pi || ref)", scale=1 / MAX_LEN),
    # CISPO: the clipped ratio as a constant weight of every token's gradient
    Row("cispo, weight clipped to [0.9, 1.1], a later minibatch (rloo)",
        _spec(**_RLOO, policy_loss="cispo", clip_range=0.1, clip_high=0.1), sampler="behind"),
    # online DPO: the best and the worst of a group of 2 as a DPO pair, beta = the world's
    Row("online dpo (best vs worst of 2, dpo beta 0.5)",
        _spec(advantages="preference", policy_loss="dpo", kl_in="none", dpo_beta=0.5,
              group_size=2), batch=2),
    # a sampler one update behind, each entry of offpolicy.OFFPOLICY
    Row("lagging sampler, uncorrected (rloo)", _spec(**_RLOO), sampler="lagging"),
    Row("lagging sampler, ratio and clip against the sampler (rloo)", _spec(**_RLOO),
        sampler="lagging", correction="clip"),
    Row("lagging sampler, decoupled, uncapped (rloo)", _spec(**_RLOO), sampler="lagging",
        correction="decoupled"),
    Row("lagging sampler, tis cap 1.2 (rloo)", _spec(**_RLOO), sampler="lagging",
        correction="tis", cap=1.2),
    Row("lagging sampler, mask outside [1/1.2, 1.2] (rloo)", _spec(**_RLOO), sampler="lagging",
        correction="mask", cap=1.2),
    Row("lagging sampler, gspo clip 0.1 against the sampler (rloo)",
        _spec(advantages="rloo", policy_loss="sequence", reduction="sequence", clip_range=0.1,
              clip_high=0.1), sampler="lagging", correction="gspo"),
]


def evaluation_point(world: World) -> tuple[torch.Tensor, torch.Tensor]:
    """(table, behind): where the table's gradients are compared. `behind` is a policy away
    from the reference (at the reference every KL gradient is 0, so the KL rows would agree
    for nothing); `table` is one natural-gradient step of J later (`natural`, step 0.2), so
    a row whose sampler is behind sees per-token ratios of about 0.8 to 1.5."""
    gen = torch.Generator().manual_seed(5)
    behind = world.ref + 0.7 * torch.randn(world.ref.shape, generator=gen, dtype=torch.float64)
    return behind + 0.2 * natural(behind, objective_gradient(behind, world)), behind


def natural(table: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """The natural-gradient form of `update`: each prefix's entries divided by the Fisher
    information of its next-token distribution, w(p) (diag(pi_p) - pi_p pi_p^T), which for a
    softmax comes to dividing each entry by w(p) pi(token | p) (the update of a prefix sums
    to 0, as the gradient of anything through a softmax does). A positive rescaling: it
    leaves still what `update` leaves still, so the fixed points are the same, reached in tens
    of steps instead of thousands (a plain step crawls at the prefixes the policy rarely
    reaches and the tokens it rarely writes)."""
    pi = conditionals(table).exp()[:, 1:]                               # (P, V - 1)
    out = torch.zeros_like(update)
    out[:, 1:] = update[:, 1:] / (visits(table)[:, None] * pi)
    return out


class Ascent(NamedTuple):
    table: torch.Tensor   # where it ended
    steps: int            # steps taken
    norm: float           # the expected update's norm there
    outcome: str          # "fixed point" | "circles" | "still moving"


def exact_ascent(row: Row, world: World, lr: float = 1.0, steps: int = 600,
                 tol: float = 1e-10) -> Ascent:
    """Follow the row's expected update (in its natural form, step `lr`) from the task
    world's reference (a distillation row's student starts there too) until it stops moving. A row whose sampler lags uses the previous iterate as the policy
    behind. No entry of the table moves by more than 1 per step.

    Outcomes: "fixed point", the update's norm fell below `tol`; "circles", the step had to
    shrink a billionfold: a row that divides its advantages by their spread within a batch
    (whitening) has an update that does not shrink near where it would stop, so it
    overshoots and the next update points back (each time, the step is halved); "still
    moving", `steps` ran out with the update above `tol` (a row with no fixed point drifts
    on, towards a policy that puts no mass on some tokens); "runs away", a penalty on such
    a token grew past float64 (the table returned is the last finite one)."""
    table = behind = world.ref.clone()
    world = world_of(row, world)
    last, step_size = None, lr
    for step in range(steps):
        update = expected_update(row, table, world, behind=behind)
        norm = update.norm().item()
        if norm < tol:
            return Ascent(table, step, norm, "fixed point")
        if not math.isfinite(norm):  # a penalty grew past float64: the last finite table
            return Ascent(behind, step, norm, "runs away")
        if last is not None and (update * last).sum() < 0:  # it points back: overshot
            step_size /= 2
            if step_size < 1e-9 * lr:
                return Ascent(table, step, norm, "circles")
        last = update
        move = step_size * natural(table, update)
        behind, table = table, table + move / max(1.0, move.abs().max().item())
    return Ascent(table, steps, norm, "still moving")


# ----------------------------------------------------------------------------- the table
def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a * b).sum() / (a.norm() * b.norm())).item()


def table_row(row: Row, world: World, steps: int) -> dict:
    """One row's figures: at the evaluation point, the cosine and norm ratio of its expected
    update to grad J and its distance to its closed form; from the exact ascent, where it
    ends (KL to pi* and to the reference, E[r] there)."""
    table, behind = evaluation_point(world)
    ascent = exact_ascent(row, world, steps=steps)
    world = world_of(row, world)  # (J, pi* and the reference of a distillation row's world)
    update = expected_update(row, table, world, behind=behind)
    grad_j = objective_gradient(table, world)
    end = ascent.table
    out = {"name": row.name, "unbiased": row.follows == "grad J", "follows": row.follows,
           "cosine": cosine(update, grad_j), "norm_ratio": (update.norm() / grad_j.norm()).item(),
           "outcome": ascent.outcome, "steps": ascent.steps, "end_norm": ascent.norm,
           "kl_to_optimum": kl(end, optimal_policy(world)).item(),
           "kl_to_ref": kl(end, world.ref).item(),
           "reward": (response_logprobs(end).exp() * world.reward).sum().item(),
           "objective": objective(end, world).item()}
    if row.follows:
        target = row.scale * FOLLOWS[row.follows](table, world)
        out["gap_to_closed_form"] = (update - target).abs().max().item()
    return out


@dataclass
class Config:
    out: str = opt("bench/results/gradients.json", "where to write the table (JSON)")
    steps: int = opt(2000, "most steps of each row's exact ascent")
    seed: int = opt(0, "the world's seed (its reference logits and rewards)")
    beta: float = opt(0.5, "the world's KL coefficient")
    markdown: bool = opt(False, "only print the table of --out's JSON as docs/gradients.md "
                                "holds it (no computation)")


def markdown_table(result: dict) -> str:
    """The rows of a result (main's JSON) as the Markdown table docs/gradients.md holds."""
    def small(x: float) -> str:
        return f"{x:.0e}" if x < 1e-3 else f"{x:.2g}" if x < 1 else f"{x:.3g}"
    lines = ["| configuration | unbiased for J | cos to grad J | norm / grad J | ascent ends | "
             "KL(end &#124;&#124; pi*) | KL(end &#124;&#124; ref) | E[r] at end | J at end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {'**yes**' if r['unbiased'] else 'no'} | {r['cosine']:.4f} | "
                     f"{r['norm_ratio']:.4f} | {r['outcome']} | {small(r['kl_to_optimum'])} | "
                     f"{r['kl_to_ref']:.3f} | {r['reward']:.3f} | {r['objective']:.3f} |")
    return "\n".join(lines)


def main(cfg: Config) -> dict:
    if cfg.markdown:
        with open(cfg.out) as f:
            result = json.load(f)
        print(markdown_table(result))
        return result
    torch.set_num_threads(1)  # the world's tensors are tiny: threads cost more than they bring
    world = make_world(cfg.seed, cfg.beta)
    star = optimal_policy(world)
    rows = []
    print("| configuration | unbiased | cos to grad J | norm / grad J | ascent | KL(end || pi*) "
          "| KL(end || ref) | E[r] at end | J at end |\n|---|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        r = table_row(row, world, cfg.steps)
        rows.append(r)
        print(f"| {r['name']} | {'yes' if r['unbiased'] else 'no'} | {r['cosine']:.4f} | "
              f"{r['norm_ratio']:.4f} | {r['outcome']} ({r['steps']}) | {r['kl_to_optimum']:.2e} "
              f"| {r['kl_to_ref']:.3f} | {r['reward']:.4f} | {r['objective']:.4f} |", flush=True)
    result = {"command": "python -m mingpt_rlhf.lab.gradients", "date": time.strftime("%Y-%m-%d"),
              "world": {"seed": cfg.seed, "beta": cfg.beta, "responses": len(RESPONSES),
                        "group": GROUP, "budget": MAX_LEN},
              "optimum": {"kl_to_ref": kl(star, world.ref).item(), "objective": optimal_value(world),
                          "objective_at_ref": objective(world.ref, world).item(),
                          "reward": (response_logprobs(star).exp() * world.reward).sum().item(),
                          "max_reward": world.reward.max().item()},
              "rows": rows}
    os.makedirs(os.path.dirname(cfg.out) or ".", exist_ok=True)
    with open(cfg.out, "w") as f:
        json.dump(result, f, indent=1)
    best = result["optimum"]
    print(f"pi*: KL to ref {best['kl_to_ref']:.3f}, E[r] {best['reward']:.4f}, J "
          f"{best['objective']:.4f} (J at the reference {best['objective_at_ref']:.4f}, max r "
          f"{best['max_reward']:.4f}); wrote {cfg.out}")
    return result


if __name__ == "__main__":
    run(main, Config)
