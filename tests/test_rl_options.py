"""The one rule of rl_options.READ_ONLY_WITH: an option that only some runs read, set to
anything but its default, is refused where the resolved configuration does not read it (one
line naming what it needs) and accepted where it does. Every row of the table has an example
here, so a new row cannot land unchecked."""
import dataclasses

import pytest

import conftest
import train_ppo
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.run.rl_options import READ_ONLY_WITH, default_of

ONLINE_DPO = {"algo": "online_dpo"}

# option: (a value other than its default, [configs that do not read it], a config that does)
EXAMPLES = {
    "group_size": (4, [{}, {"algo": "reinforce++"}], {"algo": "grpo"}),
    "grpo_norm": ("grpo", [{"algo": "rloo"}], {"algo": "grpo"}),
    "dpo_beta": (0.5, [{}], ONLINE_DPO),
    "dpo_loss": ("ipo", [{"algo": "grpo"}], ONLINE_DPO),
    "critic": ("shared", [{"algo": "grpo"}], {}),
    "critic_lr": (1e-4, [{"algo": "rloo"}], {}),
    "clip_range_value": (0.1, [{"algo": "reinforce++"}], {}),
    "vf_coef": (0.5, [{}, {"algo": "grpo"}], {"critic": "shared"}),
    "lam": (0.9, [{"algo": "reinforce++"}], {}),
    "gamma": (0.9, [{"algo": "grpo"}], {"algo": "reinforce++"}),
    "ratio": ("sequence", [{}, ONLINE_DPO], {"algo": "rloo"}),
    "dynamic_sampling": (2, [{}, ONLINE_DPO], {"algo": "grpo"}),
    "clip_range": (0.1, [ONLINE_DPO, {"cov_loss": "kl_cov"}], {"cov_loss": "clip_cov"}),
    "clip_range_high": (0.28, [ONLINE_DPO, {"algo": "grpo", "cov_loss": "kl_cov"}], {}),
    "reduction": ("token", [ONLINE_DPO], {}),
    "offpolicy": ("clip", [ONLINE_DPO], {}),
    "tis_cap": (2.0, [ONLINE_DPO, {"offpolicy": "none"}, {"offpolicy": "clip"},
                      {"algo": "grpo", "offpolicy": "gspo"}], {"offpolicy": "decoupled"}),
    "learn_batch_size": (4, [ONLINE_DPO], {}),
    "kl_in": ("loss", [ONLINE_DPO], {}),
    "kl_estimator": ("k3", [ONLINE_DPO], {}),
    "kl_coef": (0.1, [ONLINE_DPO], {"algo": "grpo"}),
    "adaptive_kl": (False, [ONLINE_DPO], {}),
    "kl_horizon": (5.0, [ONLINE_DPO, {"adaptive_kl": False}], {}),
    "learn_tokens": ("top_entropy", [ONLINE_DPO, {"algo": "grpo", "ratio": "sequence"}], {}),
    "top_entropy_quantile": (0.5, [{}], {"learn_tokens": "top_entropy"}),
    "cov_loss": ("kl_cov", [ONLINE_DPO, {"algo": "grpo", "ratio": "sequence"}], {}),
    "cov_ratio": (0.1, [{}], {"cov_loss": "kl_cov"}),
    "clip_cov_low": (0.5, [{}, {"cov_loss": "kl_cov"}], {"cov_loss": "clip_cov"}),
    "clip_cov_high": (4.0, [{}, {"cov_loss": "kl_cov"}], {"cov_loss": "clip_cov"}),
    "kl_cov_coef": (0.5, [{}, {"cov_loss": "clip_cov"}], {"cov_loss": "kl_cov"}),
    "eval_prompts_file": ("eval.jsonl", [{}], {"prompts": "train.jsonl"}),
    "task": ("sort", [{"prompts": "train.jsonl"}, {"env": "guess"}], {}),
    "prompts": ("train.jsonl", [{"env": "guess"}], {}),
    "generate_batch_size": (4, [{"env": "guess"}], {}),
    "max_turns": (4, [{}], {"env": "guess"}),
    "mask_env": (False, [{}], {"env": "guess"}),
    "teacher_dir": ("out/ppo", [{}, {"algo": "grpo"}], {"algo": "distill"}),
    "distill_form": ("token", [{}, ONLINE_DPO], {"algo": "distill", "teacher_dir": "out/ppo"}),
    "ptx_data": ("demos.jsonl", [{"algo": "grpo"}, {"env": "guess"}, {"ptx_coef": 0.0}], {}),
    "reward_clip": (2.0, [{"reward": "task"}, {"env": "guess"}], {}),
    "ensemble_combine": ("wco", [{"reward": "task"}], {}),
    "uwo_lambda": (0.3, [{}, {"reward": "task", "ensemble_combine": "mean"}],
                   {"ensemble_combine": "uwo"}),
    "heldout_rm_dir": ("out/rm_heldout", [{"reward": "task"}], {}),
    "penalize_missing_eos": (False, [{"env": "guess"}], {}),
    "missing_eos_penalty": (-2.0, [{"env": "guess"}, {"penalize_missing_eos": False}], {}),
    "overlong_buffer": (4, [{"env": "guess"}, {"penalize_missing_eos": False}], {}),
}


def checked(**options) -> train_ppo.Config:
    cfg = train_ppo.Config(**options)
    train_ppo.check_config(cfg)
    return cfg


def test_every_row_of_the_table_has_an_example():
    assert set(EXAMPLES) == set(READ_ONLY_WITH)
    for name, (value, _, _) in EXAMPLES.items():
        assert value != default_of(train_ppo.Config(), name), name


@pytest.mark.parametrize("name", sorted(READ_ONLY_WITH))
def test_an_option_is_refused_where_the_run_does_not_read_it(name):
    value, unread, _ = EXAMPLES[name]
    for context in unread:
        checked(**context)  # the context alone is a valid run
        with pytest.raises(UserError) as e:
            checked(**context, **{name: value})
        line = str(e.value)
        assert line.startswith(f"--{name} ") and "would be ignored" in line, line
        assert READ_ONLY_WITH[name][1] in line and "\n" not in line, line


@pytest.mark.parametrize("name", sorted(READ_ONLY_WITH))
def test_an_option_is_taken_where_the_run_reads_it(name):
    value, _, read = EXAMPLES[name]
    cfg = checked(**read, **{name: value})
    assert getattr(cfg, name) == value


def test_an_option_at_its_default_is_never_refused():
    """Passing a default explicitly, or an "auto" that resolves to nothing, changes nothing."""
    for name in READ_ONLY_WITH:
        default = default_of(train_ppo.Config(), name)
        for context in [{}, ONLINE_DPO, {"algo": "grpo"}, {"env": "guess"}]:
            checked(**context, **{name: default})


@pytest.mark.parametrize("context", [{}, {"algo": "grpo"}, {"algo": "reinforce++"}, ONLINE_DPO,
                                     {"env": "guess", "algo": "rloo"}, {"reward": "task"}])
def test_what_the_run_does_not_read_stays_at_its_default_and_a_checked_config_checks_again(context):
    """check_config resolves "auto"s, but not for an option the run ignores (a group size for
    ppo, a critic for grpo): the checkpoint's config says what was used, and the checked
    config, given again (a script that calls main with it), is accepted as it is."""
    cfg = checked(**context)
    for name, (reads, _) in READ_ONLY_WITH.items():
        if not reads(cfg):
            assert getattr(cfg, name) == default_of(cfg, name), name
    again = dataclasses.replace(cfg)
    train_ppo.check_config(again)
    assert again == cfg


def test_the_script_refuses_an_unread_option_with_one_line(tmp_path, capsys):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"),
                                                  "--algo", "grpo", "--lam", "0.9"])
    assert line.startswith("error: --lam 0.9 would be ignored: it is read only with --algo ppo"), line


@pytest.mark.parametrize("reward,made_by", [("env", "--env ENV"),
                                            ("teacher", "--algo distill --teacher_dir DIR")])
def test_a_reward_only_a_method_sets_is_refused_without_it(tmp_path, capsys, reward, made_by):
    """--reward env and --reward teacher are what --env and --algo distill resolve --reward
    to: alone, env ended in a traceback (prompts, no environment) and teacher trained PPO on a
    score of 0 for every response."""
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"),
                                                  "--reward", reward])
    assert line == (f"error: --reward {reward} is set by {made_by}, not a reward of its own: "
                    f"pass {made_by}, or --reward rm, task or FILE.py:FUNCTION"), line
    assert checked(algo="distill", teacher_dir="out/ppo").reward == "teacher"  # resolved: fine
    assert checked(env="guess", reward="env").reward == "env"


def test_a_resumed_run_compares_only_the_options_it_reads():
    """Checkpoints saved a GRPO run's --critic resolved (separate with a reward model); it
    builds nothing for GRPO, so resuming one is not refused over it."""
    cfg = checked(algo="grpo")
    train_ppo.require_same_options(cfg, {"critic": "separate", "reward": "rm"}, "ckpt.pt")
    with pytest.raises(UserError, match="started with --reward task"):
        train_ppo.require_same_options(cfg, {"reward": "task"}, "ckpt.pt")
    with pytest.raises(UserError, match="started with --critic shared"):
        train_ppo.require_same_options(checked(), {"critic": "shared"}, "ckpt.pt")


@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo"])
def test_a_library_caller_with_env_gets_the_episodes_defaults(algo):
    """PPOTrainer resolves a caller's Config(env=...) as the script does (which also sets
    --reward env): the KL in the loss, 0.2 for groups, 1e-4 and no ptx."""
    from mingpt_rlhf.ppo_trainer import resolve_auto_options
    direct = resolve_auto_options(train_ppo.Config(algo=algo, env="guess"))
    script = checked(algo=algo, env="guess")
    for name in ("actor_lr", "ptx_coef", "kl_in", "kl_coef", "kl_estimator"):
        assert getattr(direct, name) == getattr(script, name), name
    assert (direct.kl_in, direct.actor_lr, direct.ptx_coef) == ("loss", 1e-4, 0.0)
    assert direct.kl_coef == (0.05 if algo == "ppo" else 0.2)


def test_gspos_ratio_resolved_from_offpolicy_reaches_every_check():
    """--offpolicy gspo resolves --ratio to sequence; the checks that read --ratio and the
    checkpoint's config see it (they saw "token" and accepted a token-ratio loss beside it)."""
    cfg = checked(algo="grpo", offpolicy="gspo", sampler_lag=1)
    assert cfg.ratio == "sequence" and cfg.reduction == "sequence"
    for option in ({"cov_loss": "kl_cov"}, {"learn_tokens": "top_entropy"}):
        with pytest.raises(UserError, match="would be ignored: it is read only with .*--ratio token"):
            checked(algo="grpo", offpolicy="gspo", sampler_lag=1, **option)
