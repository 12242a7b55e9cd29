"""The RL script's options checked together, before anything is loaded: every combination
that cannot work is refused with one line that names the fix (a UserError: exit status 2,
no traceback), and every "auto" that depends on another option is resolved here, so that
the checkpoint saves the values the run trains with. `train_ppo.main` calls `check_config`
first; tests call it on a parsed command line, as the script does.

One rule covers the options that only some runs read (`READ_ONLY_WITH`): set to anything but
its default where the resolved configuration does not read it, an option is refused, naming
what it needs, rather than ignored while the user believes it is at work."""
from __future__ import annotations

import dataclasses

from ..machinery.cli import require_non_negative, require_positive
from ..lab.ensemble import COMBINE_CHOICES
from ..machinery.errors import UserError
from ..machinery.lora import check_lora_options
from ..losses import GROUP_ALGOS, TABLES
from ..lab.offpolicy import MAX_LAG, OFFPOLICY, READS_CAP, resolved_offpolicy
from ..ppo_trainer import resolve_auto_options

LOSS_ALGOS = "with --algo ppo, grpo, rloo or reinforce++ (online_dpo's loss is DPO's)"
DPO_KL = ("with --algo ppo, grpo, rloo or reinforce++ (online_dpo's KL to the reference is "
          "--dpo_beta, inside its loss; distill's is to the teacher, at beta 1)")
CLIPPED = ("with --algo ppo, grpo, rloo or reinforce++ and not with --cov_loss kl_cov (online_dpo's "
           "loss is DPO's; KL-Cov clips no token, it charges |log ratio| instead)")
NO_RATIO = ("with --algo ppo, grpo, rloo or reinforce++ (online_dpo's loss has no ratio to the "
            "sampler: a lagging sampler changes its pairs, not its loss)")

# option -> (does the resolved config read it?, what it needs: "--X is read only <needs>").
# An option that every run reads has no row. Its default is never refused, so an "auto"
# sentinel is safe here; the predicates see the config after every "auto" is resolved.
READ_ONLY_WITH = {
    # which method: its own options
    "group_size": (lambda c: c.algo in GROUP_ALGOS, "with --algo grpo, rloo or online_dpo"),
    "grpo_norm": (lambda c: c.algo == "grpo", "with --algo grpo"),
    "dpo_beta": (lambda c: c.algo == "online_dpo", "with --algo online_dpo"),
    "dpo_loss": (lambda c: c.algo == "online_dpo", "with --algo online_dpo"),
    "critic": (lambda c: c.algo == "ppo", "with --algo ppo (the others have no critic)"),
    "critic_lr": (lambda c: c.algo == "ppo", "with --algo ppo (the others have no critic)"),
    "clip_range_value": (lambda c: c.algo == "ppo", "with --algo ppo (the others have no critic)"),
    "vf_coef": (lambda c: c.algo == "ppo" and c.critic == "shared",
                "with --algo ppo and a shared critic (--critic shared, the default without "
                "--reward rm): a separate critic has its own optimizer"),
    "lam": (lambda c: c.algo == "ppo", "with --algo ppo (GAE's lambda)"),
    "gamma": (lambda c: c.algo in ("ppo", "reinforce++"),
              "with --algo ppo or reinforce++ (the others score whole responses)"),
    "ratio": (lambda c: c.algo in ("grpo", "rloo"),
              "with --algo grpo or rloo (GSPO's ratio needs one advantage per response)"),
    "dynamic_sampling": (lambda c: c.algo in ("grpo", "rloo"),
                         "with --algo grpo or rloo (online_dpo already learns nothing from a "
                         "tied group)"),
    # the PPO family's loss, which online DPO replaces by DPO's
    "clip_range": (lambda c: c.algo != "online_dpo" and c.cov_loss != "kl_cov", CLIPPED),
    "clip_range_high": (lambda c: c.algo != "online_dpo" and c.cov_loss != "kl_cov", CLIPPED),
    "reduction": (lambda c: c.algo != "online_dpo", LOSS_ALGOS),
    "offpolicy": (lambda c: c.algo != "online_dpo", NO_RATIO),
    # --tis_cap bounds the weights of the corrections that weigh tokens; none, clip and gspo
    # weigh none (auto is tis when --tis_cap is set)
    "tis_cap": (lambda c: c.algo != "online_dpo" and resolved_offpolicy(c) in READS_CAP,
                f"with --offpolicy {', '.join(READS_CAP[:-1])} or {READS_CAP[-1]} (auto is tis "
                f"when --tis_cap is set), which weigh each token, and not with --algo "
                f"online_dpo (its loss has no ratio to the sampler)"),
    # the KL penalty and its controller: online DPO's KL is its beta, distill's the teacher's
    "kl_in": (lambda c: c.algo not in ("online_dpo", "distill"), DPO_KL),
    "kl_estimator": (lambda c: c.algo not in ("online_dpo", "distill"), DPO_KL),
    "kl_coef": (lambda c: c.algo not in ("online_dpo", "distill"), DPO_KL),
    "adaptive_kl": (lambda c: c.algo not in ("online_dpo", "distill"), DPO_KL),
    "kl_horizon": (lambda c: c.algo not in ("online_dpo", "distill") and c.adaptive_kl,
                   "with --adaptive_kl true (the default: a fixed beta has no speed), not with "
                   "--algo online_dpo (its KL is --dpo_beta) or distill (beta 1, to the teacher)"),
    "learn_batch_size": (lambda c: c.algo != "online_dpo",
                         "with --algo ppo, grpo, rloo or reinforce++ (online_dpo's loss is a "
                         "mean over the pairs with a preference, which a slice cannot count)"),
    # which tokens learn: a per-token choice of the PPO family's surrogate
    "learn_tokens": (lambda c: c.algo != "online_dpo" and c.ratio == "token",
                     "with --algo ppo, grpo, rloo or reinforce++ and --ratio token (online_dpo "
                     "learns from whole pairs, GSPO from one ratio per response)"),
    "top_entropy_quantile": (lambda c: c.learn_tokens == "top_entropy",
                             "with --learn_tokens top_entropy"),
    # the entropy mechanism's losses replace the token ratio's surrogate (lab/entropy.py)
    "cov_loss": (lambda c: c.algo != "online_dpo" and c.ratio == "token",
                 "with --algo ppo, grpo, rloo or reinforce++ and --ratio token (they act on "
                 "each token's ratio)"),
    "cov_ratio": (lambda c: c.cov_loss != "none", "with --cov_loss clip_cov or kl_cov"),
    "clip_cov_low": (lambda c: c.cov_loss == "clip_cov", "with --cov_loss clip_cov"),
    "clip_cov_high": (lambda c: c.cov_loss == "clip_cov", "with --cov_loss clip_cov"),
    "kl_cov_coef": (lambda c: c.cov_loss == "kl_cov", "with --cov_loss kl_cov"),
    # where the data and the reward come from
    "eval_prompts_file": (lambda c: bool(c.prompts),
                          "with --prompts (the built-in task has its own eval prompts)"),
    "task": (lambda c: not c.prompts and not c.env, "without --prompts and --env (they replace "
                                                    "the built-in task)"),
    "prompts": (lambda c: not c.env, "without --env (episodes start from the environment's "
                                     "openings)"),
    "generate_batch_size": (lambda c: not c.env, "without --env (the episodes of a rollout "
                                                 "batch are played together)"),
    "max_turns": (lambda c: bool(c.env), "with --env"),
    "mask_env": (lambda c: bool(c.env), "with --env"),
    "teacher_dir": (lambda c: c.algo == "distill", "with --algo distill"),
    "distill_form": (lambda c: c.algo == "distill", "with --algo distill"),
    "ptx_data": (lambda c: c.ptx_coef > 0, "with --ptx_coef > 0 (auto: 0.02 for ppo without "
                                          "--env, else 0)"),
    "reward_clip": (lambda c: c.reward == "rm", "with --reward rm (a reward from code or an "
                                                "environment is used as given)"),
    "ensemble_combine": (lambda c: c.reward == "rm", "with --reward rm"),
    "uwo_lambda": (lambda c: c.reward == "rm" and c.ensemble_combine == "uwo",
                   "with --reward rm and --ensemble_combine uwo"),
    "heldout_rm_dir": (lambda c: c.reward == "rm", "with --reward rm"),
    # the score of a single response (an episode's rewards are the environment's)
    "penalize_missing_eos": (lambda c: not c.env and c.algo != "distill",
                             "without --env and --algo distill (whose reward is the teacher's)"),
    "missing_eos_penalty": (lambda c: not c.env and c.algo != "distill" and c.penalize_missing_eos,
                            "without --env and --algo distill, and with --penalize_missing_eos "
                            "true (the default)"),
    "overlong_buffer": (lambda c: not c.env and c.algo != "distill" and c.penalize_missing_eos,
                        "without --env and --algo distill, and with --penalize_missing_eos true "
                        "(the default): it is a ramp before that penalty's cliff"),
}


def default_of(cfg, name: str):
    """The default of option `name` in `cfg`'s dataclass (train_ppo.Config)."""
    field = next(f for f in dataclasses.fields(cfg) if f.name == name)
    return field.default


def given_options(cfg) -> dict:
    """The options of READ_ONLY_WITH that `cfg` sets to something other than their default:
    taken before check_config resolves any "auto"."""
    return {name: getattr(cfg, name) for name in READ_ONLY_WITH
            if getattr(cfg, name) != default_of(cfg, name)}


def reads(cfg, name: str) -> bool:
    """Whether a run of the resolved `cfg` reads option `name` (every run reads the options
    without a row in READ_ONLY_WITH)."""
    return name not in READ_ONLY_WITH or READ_ONLY_WITH[name][0](cfg)


def refuse_unread(cfg, given: dict) -> None:
    """UserError for the first option of `given` (`given_options`, before resolving) that the
    resolved `cfg` does not read. Then every option it does not read is set back to its
    default (an "auto" resolved for nothing, such as a group size for ppo): the checkpoint's
    config shows what the run used, and `check_config` accepts its own output again."""
    for name, value in given.items():
        if not reads(cfg, name):
            shown = str(value).lower() if isinstance(value, bool) else f"{value}"
            needs = READ_ONLY_WITH[name][1]
            fix = "drop it, or pass what it needs" if needs.startswith("with ") else "drop it"
            raise UserError(f"--{name} {shown} would be ignored: it is read only {needs}; {fix}")
    for name in READ_ONLY_WITH:
        if not reads(cfg, name):
            setattr(cfg, name, default_of(cfg, name))


def check_online_dpo(cfg) -> None:
    """Online DPO's own values (what its loss does not read is READ_ONLY_WITH's): it learns
    from whole pairs."""
    if cfg.dpo_loss not in ("sigmoid", "ipo"):
        raise UserError(f"--dpo_loss must be sigmoid or ipo, got {cfg.dpo_loss!r}")
    if cfg.dpo_beta <= 0:
        raise UserError(f"--dpo_beta must be > 0, got {cfg.dpo_beta}")
    if cfg.minibatch_size % 2:
        raise UserError(f"online_dpo learns from whole pairs: --minibatch_size must be even, got "
                        f"{cfg.minibatch_size}")


def check_distill(cfg) -> None:
    """Distillation's own values: a teacher, no other reward, no environment (what its reward
    does not read, such as the KL options, is READ_ONLY_WITH's)."""
    if cfg.distill_form not in ("sequence", "token"):
        raise UserError(f"--distill_form must be sequence or token, got {cfg.distill_form!r}")
    if not cfg.teacher_dir:
        raise UserError("--algo distill needs --teacher_dir, the folder of the teacher policy (a "
                        "PPO, GRPO, SFT or DPO run of the student's tokenizer)")
    if cfg.reward not in ("rm", "teacher") or cfg.env:
        raise UserError(f"--algo distill's reward is the teacher's log-probs: drop "
                        f"{'--env' if cfg.env else '--reward ' + cfg.reward}")
    cfg.reward = "teacher"


def check_config(cfg) -> None:
    given = given_options(cfg)  # before any "auto" is resolved
    if cfg.learn_batch_size < 0:
        raise UserError(f"--learn_batch_size must be >= 0 (0 = the whole minibatch), got "
                        f"{cfg.learn_batch_size}")
    if cfg.score_batch_size < 0:
        raise UserError(f"--score_batch_size must be >= 0 (0 = --minibatch_size), "
                        f"got {cfg.score_batch_size}")
    if cfg.generate_batch_size < 0:
        raise UserError(f"--generate_batch_size must be >= 0 (0 = the whole rollout batch), "
                        f"got {cfg.generate_batch_size}")
    if cfg.algo not in ("ppo", "grpo", "rloo", "reinforce++", "online_dpo", "distill"):
        raise UserError(f"--algo must be ppo, grpo, rloo, reinforce++, online_dpo or distill, got "
                        f"{cfg.algo!r}")
    if cfg.group_size == 0:
        cfg.group_size = 2 if cfg.algo == "online_dpo" else 8
    if cfg.algo == "online_dpo":
        check_online_dpo(cfg)
    if cfg.ratio not in ("token", "sequence"):
        raise UserError(f"--ratio must be token or sequence, got {cfg.ratio!r}")
    if cfg.clip_range_high < 0 or cfg.overlong_buffer < 0:
        raise UserError("--clip_range_high and --overlong_buffer must be >= 0 (0 = off)")
    if cfg.overlong_buffer >= cfg.max_new_tokens:
        raise UserError(f"--overlong_buffer {cfg.overlong_buffer} must be smaller than "
                        f"--max_new_tokens {cfg.max_new_tokens} (the ramp ends at the budget)")
    if not 0 <= cfg.sampler_lag <= MAX_LAG:
        raise UserError(f"--sampler_lag must be 0 .. {MAX_LAG}, got {cfg.sampler_lag}")
    if cfg.offpolicy not in ("auto", *OFFPOLICY):
        raise UserError(f"--offpolicy must be auto or one of {', '.join(OFFPOLICY)}, got "
                        f"{cfg.offpolicy!r}")
    if cfg.offpolicy == "gspo" and cfg.algo not in ("grpo", "rloo"):
        raise UserError(f"--offpolicy gspo takes one ratio per response, so one advantage per "
                        f"response: --algo grpo or rloo, not {cfg.algo}")
    if cfg.dynamic_sampling < 0 or cfg.tis_cap < 0:
        raise UserError("--dynamic_sampling and --tis_cap must be >= 0 (0 = off)")
    if 0 < cfg.tis_cap < 1:
        raise UserError(f"--tis_cap {cfg.tis_cap} would cap weights below 1, scaling every "
                        f"token down; use a cap >= 1 (2 is usual) or 0 (off)")
    if (cfg.tis_cap or cfg.sampler_lag or cfg.offpolicy not in ("auto", "none")) and not cfg.mask_env:
        raise UserError("--tis_cap, --offpolicy and --sampler_lag need the sampler's log-prob of every "
                        "trained token; with "
                        "--mask_env false the environment's tokens have none")
    for name, table in TABLES.items():  # each role: an entry of its table in losses.py, or auto
        allowed = ["auto"] * (default_of(cfg, name) == "auto") + list(table)
        if getattr(cfg, name) not in allowed:
            raise UserError(f"--{name} must be one of {', '.join(allowed)}, got "
                            f"{getattr(cfg, name)!r}")
    if cfg.cov_loss not in ("none", "clip_cov", "kl_cov"):
        raise UserError(f"--cov_loss must be none, clip_cov or kl_cov, got {cfg.cov_loss!r}")
    if not 0 < cfg.cov_ratio <= 1 or cfg.clip_cov_low > cfg.clip_cov_high or cfg.kl_cov_coef < 0:
        raise UserError(f"need 0 < --cov_ratio <= 1, --clip_cov_low <= --clip_cov_high and "
                        f"--kl_cov_coef >= 0, got {cfg.cov_ratio}, {cfg.clip_cov_low}, "
                        f"{cfg.clip_cov_high}, {cfg.kl_cov_coef}")
    if not 0 < cfg.top_entropy_quantile <= 1:
        raise UserError(f"--top_entropy_quantile must be in (0, 1], got "
                        f"{cfg.top_entropy_quantile}")
    if cfg.grpo_norm not in ("grpo", "dr"):
        raise UserError(f"--grpo_norm must be grpo or dr, got {cfg.grpo_norm!r}")
    if cfg.critic not in ("auto", "separate", "shared"):
        raise UserError(f"--critic must be auto, separate or shared, got {cfg.critic!r}")
    # the reward's source first: the auto options below depend on it (--env's rate). env and
    # teacher are what --env and --algo distill set --reward to, not rewards of their own: given
    # alone, env met prompts and no environment, teacher scored every response 0
    if cfg.reward == "env" and not cfg.env or cfg.reward == "teacher" and cfg.algo != "distill":
        made_by = "--env ENV" if cfg.reward == "env" else "--algo distill --teacher_dir DIR"
        raise UserError(f"--reward {cfg.reward} is set by {made_by}, not a reward of its own: "
                        f"pass {made_by}, or --reward rm, task or FILE.py:FUNCTION")
    if cfg.algo == "distill":
        check_distill(cfg)
    if cfg.env:
        if cfg.reward not in ("rm", "env"):
            raise UserError(f"--env gives the rewards (each step's); drop --reward "
                            f"{cfg.reward}")
        require_positive(cfg, "max_turns")
        cfg.reward = "env"
    # every "auto" resolved by the function PPOTrainer applies too, so the values the run
    # prints and saves are the ones it trains with
    try:
        resolved = resolve_auto_options(cfg)
    except ValueError as e:
        raise UserError(str(e)) from None
    for field in dataclasses.fields(cfg):  # every value it resolved, none left behind
        setattr(cfg, field.name, getattr(resolved, field.name))
    if cfg.cov_loss != "none" and cfg.learn_batch_size:
        raise UserError(f"--policy_loss {cfg.cov_loss} ranks the tokens of the whole minibatch "
                        f"by their current log-probs, which a slice cannot see: drop "
                        f"--learn_batch_size")
    if cfg.ptx_coef < 0:
        raise UserError(f"--ptx_coef must be >= 0 (or -1 for auto), got {cfg.ptx_coef}")
    if cfg.critic == "auto":
        cfg.critic = "separate" if cfg.reward == "rm" else "shared"
    # an option this run does not read, set anyway: refused (READ_ONLY_WITH)
    refuse_unread(cfg, given)
    require_positive(cfg, "max_iters", "rollout_batch_size", "rollouts_per_update", "ppo_epochs",
                     "minibatch_size", "max_new_tokens", "eval_interval", "kl_horizon",
                     "eval_prompts", "actor_lr", "critic_lr", "clip_range", "clip_range_value")
    require_non_negative(cfg, "grad_clip", "target_kl", "entropy_coef", "vf_coef", "reward_clip")
    if not (0 <= cfg.gamma <= 1 and 0 <= cfg.lam <= 1):
        raise UserError(f"--gamma and --lam must be in [0, 1], got {cfg.gamma} and {cfg.lam}")
    if cfg.minibatch_size > cfg.rollout_batch_size * cfg.rollouts_per_update:
        raise UserError(f"--minibatch_size {cfg.minibatch_size} is larger than an update's "
                        f"responses (--rollout_batch_size x --rollouts_per_update = "
                        f"{cfg.rollout_batch_size * cfg.rollouts_per_update})")
    if cfg.algo in GROUP_ALGOS and (cfg.group_size < 2 or cfg.rollout_batch_size % cfg.group_size):
        raise UserError(f"--rollout_batch_size {cfg.rollout_batch_size} must be a multiple of "
                        f"--group_size {cfg.group_size} (>= 2): each prompt is sampled "
                        f"group_size times")
    if cfg.reward not in ("rm", "task", "env", "teacher") and ":" not in cfg.reward:
        raise UserError(f"--reward must be rm, task, FILE.py:FUNCTION or MODULE:FUNCTION, got "
                        f"{cfg.reward!r}")
    if cfg.reward == "task" and cfg.prompts:
        raise UserError("--reward task is the built-in task's check, and --prompts replaces the "
                        "task; pass your own --reward FILE.py:FUNCTION")
    if cfg.temperature <= 0:
        raise UserError(f"--temperature must be > 0 for PPO (log-probs divide by it), got {cfg.temperature}")
    if cfg.top_k < 0:
        raise UserError(f"--top_k must be >= 0 (0 = off), got {cfg.top_k}")
    if not 0 < cfg.top_p <= 1:
        raise UserError(f"--top_p must be in (0, 1], got {cfg.top_p}")
    if (reads(cfg, "kl_coef") and cfg.kl_coef < 0) or cfg.kl_target <= 0:
        raise UserError(f"--kl_coef must be >= 0 (or -1 for auto) and --kl_target > 0, got "
                        f"{cfg.kl_coef} and {cfg.kl_target}")
    if cfg.adaptive_kl and cfg.kl_coef == 0:
        raise UserError("--kl_coef 0 with the adaptive KL controller: beta can only be scaled, "
                        "so it would stay 0; pass a starting --kl_coef > 0, or --adaptive_kl false")
    require_non_negative(cfg, "record_rollouts", "uwo_lambda")
    require_positive(cfg, "warning_window")
    if cfg.ensemble_combine not in COMBINE_CHOICES:
        raise UserError(f"--ensemble_combine must be one of {', '.join(COMBINE_CHOICES)}, got "
                        f"{cfg.ensemble_combine!r}")
    check_lora_options(cfg)


# options that decide which models a run builds: a resumed run must be started with the same
