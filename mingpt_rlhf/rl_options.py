"""The RL script's options checked together, before anything is loaded: every combination
that cannot work is refused with one line that names the fix (a UserError: exit status 2,
no traceback), and every "auto" that depends on another option is resolved here, so that
the checkpoint saves the values the run trains with. `train_ppo.main` calls `check_config`
first; tests call it on a parsed command line, as the script does."""
from __future__ import annotations

from .cli import require_non_negative, require_positive
from .ensemble import COMBINE_CHOICES
from .errors import UserError
from .lora import check_lora_options
from .losses import GROUP_ALGOS
from .offpolicy import MAX_LAG, OFFPOLICY
from .ppo_trainer import resolve_auto_options


def check_online_dpo(cfg) -> None:
    """What online DPO cannot take: its loss has no ratio to correct, no critic, no
    reduction, and learns from whole pairs."""
    if cfg.dpo_loss not in ("sigmoid", "ipo"):
        raise UserError(f"--dpo_loss must be sigmoid or ipo, got {cfg.dpo_loss!r}")
    if cfg.dpo_beta <= 0:
        raise UserError(f"--dpo_beta must be > 0, got {cfg.dpo_beta}")
    if cfg.offpolicy not in ("auto", "none") or cfg.tis_cap or cfg.ratio != "token":
        raise UserError("online_dpo's loss takes no ratio to the sampler: drop --offpolicy, "
                        "--tis_cap and --ratio (a lagging sampler changes its pairs, not its loss)")
    if cfg.minibatch_size % 2:
        raise UserError(f"online_dpo learns from whole pairs: --minibatch_size must be even, got "
                        f"{cfg.minibatch_size}")
    if cfg.learn_batch_size:
        raise UserError("online_dpo's loss is a mean over the pairs of a whole minibatch: drop "
                        "--learn_batch_size")
    if cfg.dynamic_sampling:
        raise UserError("online_dpo already leaves out the groups whose scores are all equal; "
                        "drop --dynamic_sampling")


def check_config(cfg) -> None:
    if cfg.eval_prompts_file and not cfg.prompts:
        raise UserError("--eval_prompts_file goes with --prompts (the built-in task has its own "
                        "eval prompts); pass your training prompts as --prompts too")
    if cfg.learn_batch_size < 0:
        raise UserError(f"--learn_batch_size must be >= 0 (0 = the whole minibatch), got "
                        f"{cfg.learn_batch_size}")
    if cfg.score_batch_size < 0:
        raise UserError(f"--score_batch_size must be >= 0 (0 = --minibatch_size), "
                        f"got {cfg.score_batch_size}")
    if cfg.generate_batch_size < 0:
        raise UserError(f"--generate_batch_size must be >= 0 (0 = the whole rollout batch), "
                        f"got {cfg.generate_batch_size}")
    if cfg.algo not in ("ppo", "grpo", "rloo", "reinforce++", "online_dpo"):
        raise UserError(f"--algo must be ppo, grpo, rloo, reinforce++ or online_dpo, got {cfg.algo!r}")
    if cfg.group_size == 0:
        cfg.group_size = 2 if cfg.algo == "online_dpo" else 8
    if cfg.algo == "online_dpo":
        check_online_dpo(cfg)
    if cfg.ratio not in ("token", "sequence"):
        raise UserError(f"--ratio must be token or sequence, got {cfg.ratio!r}")
    if cfg.ratio == "sequence" and cfg.algo not in ("grpo", "rloo"):
        raise UserError(f"--ratio sequence (GSPO) needs one advantage per response: --algo grpo "
                        f"or rloo, not {cfg.algo} (its advantages differ per token)")
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
    if cfg.dynamic_sampling and cfg.algo not in ("grpo", "rloo"):
        raise UserError(f"--dynamic_sampling drops groups of equal scores: --algo grpo or rloo, "
                        f"not {cfg.algo} (it has no groups)")
    if (cfg.tis_cap or cfg.sampler_lag or cfg.offpolicy not in ("auto", "none")) and not cfg.mask_env:
        raise UserError("--tis_cap, --offpolicy and --sampler_lag need the sampler's log-prob of every "
                        "trained token; with "
                        "--mask_env false the environment's tokens have none")
    if cfg.overlong_buffer and cfg.env:
        raise UserError("--overlong_buffer shapes single responses; with --env the "
                        "environment's rewards are used as they are")
    if cfg.overlong_buffer and not cfg.penalize_missing_eos:
        raise UserError("--overlong_buffer is a ramp before the missing-EOS penalty's cliff, "
                        "which --penalize_missing_eos false removes; drop one of them")
    if cfg.kl_in not in ("auto", "reward", "loss"):
        raise UserError(f"--kl_in must be auto, reward or loss, got {cfg.kl_in!r}")
    if cfg.kl_estimator not in ("auto", "k1", "k2", "k3"):
        raise UserError(f"--kl_estimator must be auto, k1, k2 or k3, got {cfg.kl_estimator!r}")
    if cfg.reduction not in ("auto", "token", "sequence", "budget"):
        raise UserError(f"--reduction must be auto, token, sequence or budget, got {cfg.reduction!r}")
    if cfg.grpo_norm not in ("grpo", "dr"):
        raise UserError(f"--grpo_norm must be grpo or dr, got {cfg.grpo_norm!r}")
    # the reward's source first: the auto options below depend on it (--env's rate)
    if cfg.env:
        if cfg.reward not in ("rm", "env"):
            raise UserError(f"--env gives the rewards (each step's); drop --reward "
                            f"{cfg.reward}")
        if cfg.prompts:
            raise UserError("--env plays episodes from the environment's openings; drop "
                            "--prompts (or --env to answer prompts)")
        require_positive(cfg, "max_turns")
        cfg.reward = "env"
    elif not cfg.mask_env:
        raise UserError("--mask_env false is for episodes; pass --env too")
    # every "auto" resolved by the function PPOTrainer applies too, so the values the run
    # prints and saves are the ones it trains with
    try:
        resolved = resolve_auto_options(cfg)
    except ValueError as e:
        raise UserError(str(e)) from None
    for name in ("actor_lr", "ptx_coef", "kl_in", "kl_estimator", "reduction"):
        setattr(cfg, name, getattr(resolved, name))
    if cfg.ptx_coef < 0:
        raise UserError(f"--ptx_coef must be >= 0 (or -1 for auto), got {cfg.ptx_coef}")
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
    if cfg.critic not in ("auto", "separate", "shared"):
        raise UserError(f"--critic must be auto, separate or shared, got {cfg.critic!r}")
    if cfg.critic == "auto":
        cfg.critic = "separate" if cfg.reward == "rm" else "shared"
    if cfg.reward not in ("rm", "task", "env") and ":" not in cfg.reward:
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
    if cfg.kl_coef < 0 or cfg.kl_target <= 0:
        raise UserError("--kl_coef must be >= 0 and --kl_target > 0")
    if cfg.adaptive_kl and cfg.kl_coef == 0:
        raise UserError("--kl_coef 0 with the adaptive KL controller: beta can only be scaled, "
                        "so it would stay 0; pass a starting --kl_coef > 0, or --adaptive_kl false")
    require_non_negative(cfg, "record_rollouts", "uwo_lambda")
    require_positive(cfg, "warning_window")
    if cfg.ensemble_combine not in COMBINE_CHOICES:
        raise UserError(f"--ensemble_combine must be one of {', '.join(COMBINE_CHOICES)}, got "
                        f"{cfg.ensemble_combine!r}")
    if cfg.reward != "rm" and (cfg.ensemble_combine != "mean" or cfg.heldout_rm_dir):
        raise UserError("--ensemble_combine and --heldout_rm_dir are for reward models "
                        "(--reward rm); drop them with --reward " + cfg.reward)
    check_lora_options(cfg)


# options that decide which models a run builds: a resumed run must be started with the same
