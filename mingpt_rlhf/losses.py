"""Every way the trainer turns a rollout into a loss, by name: one table per role.

The PPO family differs in a few choices, each a role with a table of interchangeable entries
of one signature: ADVANTAGES (where the baseline comes from), POLICY_LOSSES (the surrogate),
REDUCTIONS (how token losses become one number), LEARN_TOKENS (which tokens learn),
KL_ESTIMATORS and KL_PLACEMENTS (which estimate of the KL, in the reward or in the loss).
PPO's entries: gae, token, token, all, k1 in the reward. Each table's comment gives its
signature; docs/fork_it.md lists every entry and how to add one.

The trainer makes one call per role through the two functions at the end, which the gradient
oracle (lab/gradients.py) calls too: `experience_advantages` when a rollout is scored,
`actor_loss` for each minibatch. A new entry needs a row in the oracle (tests/test_gradients.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .methods.critic_free import group_advantages, k3_kl, leave_one_out_advantages, zero_group_fraction
from .machinery.distributed import gather, is_distributed, tokens_per_rank
from .methods.distill import per_token_advantages
from .methods.online_dpo import learn_pairs, pair_loss, preference_signs, preferred_pairs
from .ppo import (REDUCTIONS, approx_kl, explained_variance, gae, kl_shaped_rewards, masked_mean,
                  masked_whiten, penalize_missing_eos, policy_loss, reduce_tokens)
from .lab.entropy import clip_cov_loss, kl_cov_loss
from .lab.refinements import overlong_shaped, reinforce_pp_advantages, sequence_policy_loss


@dataclass(frozen=True)
class LossSpec:
    """The trainer's entry in each role, and the numbers those entries read."""
    advantages: str = "gae"      # ADVANTAGES
    policy_loss: str = "token"   # POLICY_LOSSES
    reduction: str = "token"     # REDUCTIONS
    kl_in: str = "reward"        # KL_PLACEMENTS
    kl_estimator: str = "k1"     # KL_ESTIMATORS
    clip_range: float = 0.2      # the ratio's lower clip, 1 - clip_range
    clip_high: float = 0.2       # its upper clip, 1 + clip_high (DAPO's clip-higher when larger)
    entropy_coef: float = 0.0    # weight of the entropy bonus (a token mean)
    gamma: float = 1.0           # discount of gae's and reinforce++'s returns
    lam: float = 0.95            # gae's lambda
    group_size: int = 2          # rows per group for grpo / dr_grpo / rloo / preference
    dpo_beta: float = 0.3        # dpo: DPO's beta, the KL's strength
    dpo_loss: str = "sigmoid"    # dpo: sigmoid (DPO) | ipo
    learn_tokens: str = "all"    # LEARN_TOKENS
    top_entropy_quantile: float = 0.2  # top_entropy: the share of the batch's tokens that learn
    cov_ratio: float = 0.02      # clip_cov / kl_cov: the share of the minibatch's tokens chosen
    clip_cov_low: float = 1.0    # clip_cov: the band of covariances it chooses from
    clip_cov_high: float = 5.0
    kl_cov_coef: float = 0.1     # kl_cov: the weight of |log ratio| on the chosen tokens


def default_kl_estimator(kl_in: str) -> str:
    """k1 in the reward (InstructGPT's PPO), k3 in the loss (the GRPO paper)."""
    return "k3" if kl_in == "loss" else "k1"


# the algorithms that sample a group of responses per prompt (rows g*k .. g*k + k - 1)
GROUP_ALGOS = ("grpo", "rloo", "online_dpo", "distill")


def spec_of(cfg) -> LossSpec:
    """The LossSpec of a resolved train_ppo.Config (`ppo_trainer.resolve_auto_options`): each
    field from the config's option of the same name, but for the roles that DERIVED_FIELDS
    says the method decides. A caller's config without an option gets LossSpec's default."""
    named = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(LossSpec)
             if hasattr(cfg, f.name)}
    return LossSpec(**{**named, **{name: of(cfg) for name, of in DERIVED_FIELDS.items()}})


def advantages_of(cfg) -> str:
    """The run's entry of ADVANTAGES: --advantages, or (auto) the method's own: gae for ppo,
    grpo (the paper's std normalisation) or dr_grpo (none) for grpo, the method's name for the
    rest (rloo, reinforce++), preference for online DPO."""
    if getattr(cfg, "advantages", "auto") != "auto":
        return cfg.advantages
    if cfg.algo == "grpo":
        return "grpo" if getattr(cfg, "grpo_norm", "dr") == "grpo" else "dr_grpo"
    if cfg.algo == "distill":
        return "distill" if getattr(cfg, "distill_form", "sequence") == "sequence" else "distill_token"
    return {"ppo": "gae", "online_dpo": "preference"}.get(cfg.algo, cfg.algo)


def policy_loss_of(cfg) -> str:
    """The run's entry of POLICY_LOSSES: --policy_loss, or (auto) dpo for online DPO, sequence
    for GSPO's ratio (--ratio sequence or --offpolicy gspo), clip_cov or kl_cov for --cov_loss,
    else token. (An older option that the entry then leaves unread, such as --cov_loss beside
    GSPO's ratio, is refused by the script's rule for unread options.)"""
    if getattr(cfg, "policy_loss", "auto") != "auto":
        return cfg.policy_loss
    if cfg.algo == "online_dpo":
        return "dpo"
    if getattr(cfg, "ratio", "token") == "sequence" or getattr(cfg, "offpolicy", "auto") == "gspo":
        return "sequence"
    return getattr(cfg, "cov_loss", "none") if getattr(cfg, "cov_loss", "none") != "none" else "token"


def check_roles(cfg) -> None:
    """ValueError for an entry of ADVANTAGES or POLICY_LOSSES that the run's method cannot
    feed, or that contradicts the older options that pick one (--grpo_norm, --ratio,
    --cov_loss, --offpolicy gspo). What an entry needs: a critic for gae (--algo ppo), groups
    for a group's baseline (grpo, rloo), online DPO's pairs for preference and dpo, one
    advantage per response for GSPO's sequence ratio (grpo, rloo). Any other advantage entry
    (reinforce++, yours) runs with --algo ppo, whose critic's values it is given, or
    reinforce++; distillation's with --algo distill (whose groups distill's baseline needs);
    any other policy loss is read as token is."""
    algo = cfg.algo
    adv, loss = advantages_of(cfg), policy_loss_of(cfg)
    if adv not in ADVANTAGES or loss not in POLICY_LOSSES:
        return  # (check_config names the valid values)
    if getattr(cfg, "advantages", "auto") != "auto":
        own = {"gae": ("ppo",), "preference": ("online_dpo",), "distill": ("distill",),
               "distill_token": ("distill",)}
        needs = own.get(adv, ("grpo", "rloo") if adv in GROUP_BASELINES else ("ppo", "reinforce++"))
        if algo not in needs:
            raise ValueError(f"--advantages {adv} needs --algo {' or '.join(needs)}, not {algo} "
                             f"(a critic for gae, groups for a group's baseline, pairs for "
                             f"preference)")
        if getattr(cfg, "grpo_norm", "dr") == "grpo" and adv != "grpo":
            raise ValueError(f"--grpo_norm grpo picks grpo's advantages, and --advantages {adv} "
                             f"others: pass one of the two")
    elif algo == "online_dpo" and adv != "preference":
        raise ValueError("online_dpo learns from preference pairs: drop --advantages")
    elif algo == "distill" and adv not in ("distill", "distill_token"):
        raise ValueError("distill's advantages are its --distill_form's: drop --advantages")
    if getattr(cfg, "policy_loss", "auto") != "auto":
        older = {"--cov_loss": (getattr(cfg, "cov_loss", "none"), lambda v: v == "none" or v == loss),
                 "--ratio": (getattr(cfg, "ratio", "token"), lambda v: v == "token" or loss == "sequence"),
                 "--offpolicy": (getattr(cfg, "offpolicy", "auto"), lambda v: v != "gspo" or loss == "sequence")}
        for flag, (value, agrees) in older.items():
            if not agrees(value):
                raise ValueError(f"{flag} {value} picks another policy loss than --policy_loss "
                                 f"{loss}: pass one of the two")
        if (loss == "dpo") != (algo == "online_dpo"):
            raise ValueError("the dpo policy loss is online DPO's, and online DPO's loss is "
                             "dpo: --algo online_dpo with --policy_loss auto")
        if loss == "sequence" and algo not in ("grpo", "rloo"):
            raise ValueError(f"--policy_loss sequence (GSPO) takes one ratio per response, so "
                             f"one advantage per response: --algo grpo or rloo, not {algo}")


def aliases_of(loss: str) -> dict:
    """The older options that name a policy loss, set to agree with its entry (so that every
    check written against them sees the run's loss): --ratio, --cov_loss."""
    return {"ratio": "sequence" if loss == "sequence" else "token",
            "cov_loss": loss if loss in ("clip_cov", "kl_cov") else "none"}


# the LossSpec fields that no option of the same name gives: the method decides them
DERIVED_FIELDS = {
    "advantages": advantages_of,
    "policy_loss": policy_loss_of,
    # online DPO's KL to the reference is its beta, inside its loss: no KL term anywhere
    "kl_in": lambda cfg: ("none" if cfg.algo == "online_dpo" else  # distill: k1 to the teacher
                          "reward" if cfg.algo == "distill" else cfg.kl_in),
    "kl_estimator": lambda cfg: (default_kl_estimator(cfg.kl_in)
                                 if getattr(cfg, "kl_estimator", "auto") == "auto"
                                 else cfg.kl_estimator),
    # --clip_range_high 0 means the same as the lower clip
    "clip_high": lambda cfg: getattr(cfg, "clip_range_high", 0) or cfg.clip_range,
}


# ----------------------------------------------------------------------------- advantages
def _gae(rewards, values, action_mask, spec, for_update):
    advantages, returns = gae(rewards, values, action_mask, spec.gamma, spec.lam)
    # an update's batch is whitened over every process (torchrun); an eval batch on its own
    return rewards, masked_whiten(advantages, action_mask, all_ranks=for_update), returns


def _reinforce_pp(rewards, values, action_mask, spec, for_update):
    advantages = reinforce_pp_advantages(rewards, action_mask, spec.gamma, all_ranks=for_update)
    return rewards, advantages, torch.zeros_like(values)


# (B,) one reward per response -> (B,) its advantage, from its group of group_size rows
GROUP_BASELINES = {
    "grpo": lambda scores, k: group_advantages(scores, k, normalise_std=True),
    "dr_grpo": lambda scores, k: group_advantages(scores, k, normalise_std=False),
    "rloo": leave_one_out_advantages,
    "preference": preference_signs,
    "distill": leave_one_out_advantages,  # on-policy distillation's sequence form (RLOO's baseline)
}


def _grouped(name):
    def advantages(rewards, values, action_mask, spec, for_update):
        per_response = rewards.sum(-1)               # (B,) the score minus any KL penalty
        if for_update:
            adv = GROUP_BASELINES[name](per_response, spec.group_size)
        else:  # an eval batch's rows are no groups: no advantages
            adv = torch.zeros_like(per_response)
        # the rewards kept: each response's total, on every one of its tokens
        return (per_response[:, None] * action_mask, adv[:, None] * action_mask,
                torch.zeros_like(values))
    return advantages


ADVANTAGES = {"gae": _gae, "reinforce++": _reinforce_pp,
              **{name: _grouped(name) for name in GROUP_BASELINES},
              # on-policy distillation's per-token form: each token's own teacher-graded reward
              "distill_token": per_token_advantages}

# ----------------------------------------------------------------------------- KL, losses
KL_ESTIMATORS = {
    "k1": lambda logprobs, ref_logprobs: logprobs - ref_logprobs,
    "k2": lambda logprobs, ref_logprobs: 0.5 * (logprobs - ref_logprobs) ** 2,
    "k3": k3_kl,
}


# where the KL penalty goes: each entry is (the per-token rewards the advantages see, f(placed,
# logprobs, ref_logprobs, action_mask, spec, kl_coef); the loss with the KL term added, f(loss,
# logprobs, ref_logprobs, action_mask, spec, kl_coef, budget, tokens) -> (loss, figures)).
# "none" is online DPO's: its KL to the reference is DPO's beta, inside its own loss.
def _kl_in_the_reward(placed, logprobs, ref_logprobs, action_mask, spec, kl_coef):
    return kl_shaped_rewards(placed, logprobs, ref_logprobs, action_mask, kl_coef,
                             KL_ESTIMATORS[spec.kl_estimator])


def _the_score_alone(placed, logprobs, ref_logprobs, action_mask, spec, kl_coef):
    return placed


def _kl_in_the_loss(loss, logprobs, ref_logprobs, action_mask, spec, kl_coef, budget, tokens):
    kl_loss = reduce_tokens(KL_ESTIMATORS[spec.kl_estimator](logprobs, ref_logprobs),
                            action_mask, spec.reduction, budget, tokens)
    return loss + kl_coef * kl_loss, {"kl_loss": kl_loss}


def _no_kl_term(loss, logprobs, ref_logprobs, action_mask, spec, kl_coef, budget, tokens):
    return loss, {}


KL_PLACEMENTS = {"reward": (_kl_in_the_reward, _no_kl_term),
                 "loss": (_the_score_alone, _kl_in_the_loss),
                 "none": (_the_score_alone, _no_kl_term)}


def _token_ratio(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget, tokens):
    return policy_loss(logprobs, old_logprobs, advantages, action_mask, spec.clip_range,
                       spec.reduction, budget, tokens, clip_high=spec.clip_high)


def _sequence_ratio(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget,
                    tokens):
    # one advantage per response: every token of a response carries the same one. Weighed by
    # an off-policy correction (A x w_t per token), this mean would be A x mean_t(w_t), which
    # is no importance weight. A per-token weight w_t = pi(y_t | prefix) / mu(y_t | prefix)
    # corrects a term that depends on one token given its prefix; GSPO's term, A x clip(s(y))
    # with s(y) the geometric mean of the tokens' ratios, depends on the whole response, and
    # the one weight c(y) with E_mu[c(y) f(y)] = E_pi[f(y)] for every f is the response's own
    # ratio pi(y) / mu(y), the product of the w_t (whose variance grows with the length).
    # resolve_auto_options refuses the combination; --offpolicy gspo takes the ratio against
    # the sampler instead, as GSPO's paper does.
    per_response = (advantages * action_mask).sum(-1) / action_mask.sum(-1).clamp(min=1)
    return sequence_policy_loss(logprobs, old_logprobs, per_response, action_mask,
                                spec.clip_range, spec.clip_high)


def _cispo(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget, tokens):
    # CISPO (MiniMax-M1, 2025): clip the importance weight, not the update. Each token's
    # -A x log pi is weighed by its ratio clipped to [1 - clip_range, 1 + clip_high] and held
    # constant, so a token past the clip still learns (PPO's clip zeroes its gradient: the rare
    # tokens that rise fastest stop learning first). At ratio 1 it is the plain policy gradient.
    ratio = torch.exp(logprobs - old_logprobs).detach()
    weight = ratio.clamp(1 - spec.clip_range, 1 + spec.clip_high)
    loss = reduce_tokens(-weight * advantages * logprobs, action_mask, spec.reduction, budget, tokens)
    with torch.no_grad():
        clipfrac = masked_mean((weight != ratio).float(), action_mask, tokens=tokens)
    return loss, clipfrac


def _dpo(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget, tokens):
    # under torchrun (`tokens` given) the mean over the whole minibatch's pairs
    pairs = tokens_per_rank(preferred_pairs(advantages, action_mask)) if tokens is not None else None
    loss = pair_loss(logprobs, ref_logprobs, advantages, action_mask, spec.dpo_beta, spec.dpo_loss,
                     pairs)
    return loss, torch.zeros(())  # no ratio, so nothing is clipped


POLICY_LOSSES = {"token": _token_ratio, "sequence": _sequence_ratio, "dpo": _dpo,
                 "clip_cov": clip_cov_loss, "kl_cov": kl_cov_loss,  # these two: lab/entropy.py
                 "cispo": _cispo}


# ----------------------------------------------------------------------------- which tokens learn
def top_entropy_tokens(entropy, action_mask, spec, for_update, advantages=None, placed=None,
                       values=None):
    """(B, N) 1 on the tokens whose entropy is in the top `spec.top_entropy_quantile` of the
    batch's response tokens (ties at the threshold kept), 0 elsewhere: "Beyond the 80/20
    rule" (Wang et al. 2025) trains only on these forks of the reasoning. `entropy` is the
    rollout's (the policy that sampled it), so the choice stays fixed through the update and
    is the same in slices; an update's batch takes its threshold over every process's tokens
    (torchrun), an eval batch over its own. The threshold is torch.quantile's (linear
    interpolation), written with a sort so that the gradient oracle can vmap it."""
    mask = action_mask.bool()
    flat = torch.where(mask, entropy.float(), float("inf")).flatten()  # off the mask: sorted last
    if for_update and is_distributed():
        flat = torch.cat([x.to(flat.device) for x in gather(flat.cpu())])
    values = flat.sort().values
    count = (values < float("inf")).sum()
    position = (count - 1).clamp(min=0) * (1 - spec.top_entropy_quantile)
    low, high = position.floor().long(), position.ceil().long()
    threshold = values[low] + (values[high] - values[low]) * (position - low)
    return ((entropy.float() >= threshold) & mask).to(action_mask.dtype)


def negative_tokens(entropy, action_mask, spec, for_update, advantages, placed, values):
    """(B, N) 1 on the tokens whose *score* says "avoid": the policy learns only from its
    wrong answers ("negative sample reinforcement", Zhu et al. 2025, who report that it keeps
    pass@k at large k where learning from the right answers narrows it). The sign is that of
    the advantage of the score alone (`placed`, the run's advantage entry without the KL
    penalty): with the KL in the reward, a right answer whose KL is above its group's would
    have a negative advantage and learn downwards. The tokens chosen keep their whole
    advantage, KL included."""
    score_only = ADVANTAGES[spec.advantages](placed, values, action_mask, spec, for_update)[1]
    return ((score_only < 0) & action_mask.bool()).to(action_mask.dtype)


# which tokens learn: f(entropy, action_mask, spec, for_update, advantages, placed, values)
# -> (B, N) or 1.0; `placed` (B, N) the scores where they land, before any KL penalty
LEARN_TOKENS = {"all": lambda *args: 1.0,  # every token
                "top_entropy": top_entropy_tokens, "negative": negative_tokens}


def every_row(exp, group_size: int):
    return exp


# which rows of a rollout a policy loss learns from, and how many consecutive rows a
# minibatch keeps whole: every row, one at a time, unless the loss says otherwise
ROWS_TO_LEARN = {"dpo": (learn_pairs, 2)}  # online DPO: a pair per group
TABLES = {"advantages": ADVANTAGES, "policy_loss": POLICY_LOSSES, "reduction": REDUCTIONS,
          "learn_tokens": LEARN_TOKENS,
          "kl_in": ("reward", "loss"),  # the placements --kl_in offers ("none" is online DPO's)
          "kl_estimator": KL_ESTIMATORS}


# ----------------------------------------------------------------------------- figures
def check_groups(keys, group_size: int) -> None:
    """`keys` (B, T) prompts (or an episode's seed, (B, 1)) must prove that each group of rows
    (g*k .. g*k + k - 1) shares its start."""
    same = (keys.view(-1, group_size, keys.size(1)) == keys[::group_size, None]).all()
    assert same, "a group of responses must share its prompt or seed (rows g*k .. g*k + k - 1)"


def _critic_figures(scores, values, returns, action_mask, keys, spec, for_update):
    return {"explained_var": explained_variance(values, returns, action_mask)}


def _group_figures(scores, values, returns, action_mask, keys, spec, for_update):
    if not for_update:  # an eval batch holds no groups
        return {}
    check_groups(keys, spec.group_size)
    # ties of the scores, before the KL: the reward teaches those groups nothing
    return {"zero_groups": zero_group_fraction(scores, spec.group_size)}


def no_rollout_figures(*args) -> dict:
    return {}


# what an entry of ADVANTAGES adds to a rollout's figures, f(scores (B,), values, returns,
# action_mask, keys, spec, for_update) -> dict (an entry without a row: no_rollout_figures)
# (distillation's scores are all 0: its signal is the teacher's KL, which ties no group)
ROLLOUT_FIGURES = {"gae": _critic_figures, **{name: _group_figures for name in GROUP_BASELINES
                                              if name != "distill"}}


# ----------------------------------------------------------------------------- scores
# how a response's score is shaped before it lands on its last token, f(scores (B,), ended
# (B,) bool, lengths (B,), cfg) -> (B,): the missing-EOS penalty (PPO's), none (a task with no
# EOS to miss: a text continued for a fixed length), or DAPO's overlong ramp before the penalty
SCORE_SHAPING = {"missing_eos": penalize_missing_eos,
                 "none": lambda scores, ended, lengths, cfg: scores,
                 "overlong": overlong_shaped}


def score_shaping_of(cfg) -> str:
    """The run's entry of SCORE_SHAPING: --overlong_buffer, else --penalize_missing_eos; none
    for distillation, whose reward is the teacher's alone."""
    if cfg.algo == "distill":
        return "none"
    if getattr(cfg, "overlong_buffer", 0) > 0:
        return "overlong"
    return "missing_eos" if getattr(cfg, "penalize_missing_eos", True) else "none"


# ----------------------------------------------------------------------------- the two calls
def experience_advantages(placed, logprobs, ref_logprobs, values, action_mask, spec: LossSpec,
                          kl_coef: float, for_update: bool = True, weights=1.0, entropy=None):
    """(rewards, advantages, returns), each (B, N), of a scored rollout batch.

    placed: (B, N) the rewards where they land; logprobs, ref_logprobs, values: (B, N) at
    sampling time. The KL placement shapes the rewards, the advantage entry turns them into
    advantages, then `weights` (an off-policy correction's, >= 0; 1: none) and LEARN_TOKENS's
    choice (from `entropy`) multiply them. `for_update` False: an eval batch (no groups)."""
    rewards = KL_PLACEMENTS[spec.kl_in][0](placed, logprobs, ref_logprobs, action_mask, spec, kl_coef)
    rewards, advantages, returns = ADVANTAGES[spec.advantages](rewards, values, action_mask,
                                                               spec, for_update)
    learn = LEARN_TOKENS[spec.learn_tokens](entropy, action_mask, spec, for_update, advantages,
                                            placed, values)
    return rewards, advantages * weights * learn, returns


def actor_loss(logprobs, entropy, old_logprobs, ref_logprobs, advantages, action_mask,
               spec: LossSpec, kl_coef: float, budget: int, tokens=None, start_logprobs=None):
    """(loss, figures) of one minibatch: the surrogate, minus the entropy bonus, plus kl_coef x
    the KL estimate when the KL is in the loss. logprobs, entropy: (B, N) of the policy
    learning, with gradients; the rest as stored at sampling time. `start_logprobs`: where the
    update started (default `old_logprobs`), which approx-KL is taken against. figures:
    pg_loss, clipfrac, approx_kl, policy_entropy (and kl_loss), as tensors."""
    # past EOS the response is PAD, whose log-prob is the most negative float: keep it out of
    # every sum (0 * -3e38 is fine, exp(3e38) * 0 is not)
    logprobs = torch.where(action_mask.bool(), logprobs, 0.0)
    pg_loss, clipfrac = POLICY_LOSSES[spec.policy_loss](
        logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec, budget, tokens)
    entropy = masked_mean(entropy, action_mask, tokens=tokens)
    loss = pg_loss - spec.entropy_coef * entropy
    # one measure of the update's move for every policy loss, the early stop's
    # (against where this update started, not a lagging sampler: its gap is not a move)
    moved = approx_kl(logprobs, old_logprobs if start_logprobs is None else start_logprobs,
                      action_mask, tokens)
    figures = {"pg_loss": pg_loss, "clipfrac": clipfrac, "approx_kl": moved,
               "policy_entropy": entropy}
    # the KL term, when the KL is in the loss (KL_PLACEMENTS): kl_coef x the estimate, reduced
    # like the surrogate
    loss, kl_figures = KL_PLACEMENTS[spec.kl_in][1](loss, logprobs, ref_logprobs, action_mask,
                                                    spec, kl_coef, budget, tokens)
    figures.update(kl_figures)
    return loss, figures


def token_weights(logprobs, old_logprobs, ref_logprobs, advantages, action_mask, spec: LossSpec,
                  kl_coef: float, budget: int) -> dict:
    """What multiplies grad log pi(token) in the update, token by token: -d loss / d log pi of
    `actor_loss` itself (autograd, so it is the trainer's loss and no copy of it), with the
    rows given as one minibatch. Each is times B (the rows), so a number reads per response:
    a sequence-mean response of n tokens gives each token A / n, a budget sum A / budget.
    logprobs: (B, N) of the policy learning (equal to old_logprobs on a fresh batch, the
    first minibatch: ratio 1, nothing clipped). Returns (B, N) tensors, 0 off the mask:
    weight       the whole weight: surrogate_weight + kl_weight
    surrogate    the policy loss's part: advantage x (1 if the clip passes the gradient, else
                 0) x ratio x normaliser, for PPO's token ratio
    kl           the KL term's part (with the KL in the loss; in the reward it is inside the
                 advantage, so 0 here)
    normaliser   B x d reduce / d x: what the reduction gives each token
    ratio        pi / pi_old of the token (GSPO's sequence ratio for --ratio sequence)
    The entropy bonus is left out: its gradient is not along grad log pi of the taken token."""
    B = logprobs.size(0)
    mask = action_mask.bool()

    def weight_of(loss_of):
        with torch.enable_grad():  # the recorder calls this under no_grad
            x = logprobs.detach().float().clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(loss_of(x), x, allow_unused=True)
        return torch.zeros_like(x) if grad is None else torch.where(mask, -B * grad, 0.0)

    old, ref, adv, am = (t.detach().float() for t in (old_logprobs, ref_logprobs, advantages, action_mask))
    no_entropy = LossSpec(**{**spec.__dict__, "entropy_coef": 0.0})
    whole = weight_of(lambda x: actor_loss(x, torch.zeros_like(x), old, ref, adv, am, no_entropy,
                                           kl_coef, budget)[0])
    kl = torch.zeros_like(whole)
    if spec.kl_in == "loss":
        kl = weight_of(lambda x: kl_coef * reduce_tokens(
            KL_ESTIMATORS[spec.kl_estimator](torch.where(am.bool(), x, 0.0), ref), am,
            spec.reduction, budget))
    # GSPO reduces by its own sequence mean; every other loss by spec.reduction
    how = "sequence" if spec.policy_loss == "sequence" else spec.reduction
    normaliser = weight_of(lambda x: -reduce_tokens(x, am, how, budget))
    log_ratio = torch.where(mask, logprobs.detach().float() - old, 0.0)
    if spec.policy_loss == "sequence":
        log_ratio = (log_ratio.sum(-1, keepdim=True) / am.sum(-1, keepdim=True).clamp(min=1)).expand_as(log_ratio)
    return {"weight": whole, "surrogate": whole - kl, "kl": kl, "normaliser": normaliser,
            "ratio": torch.where(mask, log_ratio.exp(), 0.0)}
