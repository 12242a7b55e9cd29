"""The "which tokens learn" role (losses.LEARN_TOKENS) and the rule that builds the LossSpec:
top_entropy keeps exactly the tokens at or above torch.quantile's threshold of the batch's
entropies, the trainer's advantages are the whole run's on those and 0 elsewhere, and every
option of the loss reaches it by name (no default can drop one silently)."""
import dataclasses

import pytest
import torch

import train_ppo
from mingpt_rlhf.losses import (DERIVED_FIELDS, LEARN_TOKENS, LossSpec, experience_advantages,
                                spec_of, top_entropy_tokens)
from test_critic_free import grouped_prompts
from test_ppo_trainer import Cfg, make_trainer


@dataclasses.dataclass
class TokensCfg(Cfg):
    learn_tokens: str = "all"
    top_entropy_quantile: float = 0.2


@pytest.mark.parametrize("quantile", [0.2, 0.5, 1.0])
def test_top_entropy_keeps_the_tokens_at_or_above_the_batchs_quantile(quantile):
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(6, 9, generator=g).round(decimals=1)          # ties on purpose
    mask = (torch.rand(6, 9, generator=g) < 0.7).float()
    kept = top_entropy_tokens(entropy, mask, LossSpec(top_entropy_quantile=quantile), True)
    threshold = torch.quantile(entropy[mask.bool()], 1 - quantile)
    assert torch.equal(kept.bool(), (entropy >= threshold) & mask.bool())
    assert kept.dtype == mask.dtype
    share = kept.sum() / mask.sum()
    assert share >= quantile - 1e-6 and (quantile == 1.0 or share < 1)


def test_without_ties_top_entropy_keeps_the_share_it_is_given():
    entropy = torch.arange(40.0).view(4, 10)[torch.randperm(4)]
    kept = top_entropy_tokens(entropy, torch.ones(4, 10), LossSpec(top_entropy_quantile=0.2), True)
    assert kept.sum().item() == 8 and (entropy[kept.bool()] >= 32).all()


def test_a_batch_without_tokens_keeps_none():
    kept = top_entropy_tokens(torch.rand(2, 3), torch.zeros(2, 3), LossSpec(), True)
    assert kept.sum().item() == 0


def test_the_trainers_advantages_are_the_whole_runs_on_the_kept_tokens_and_0_elsewhere():
    """Same start, same samples: only the tokens outside the top 30 % lose their advantage,
    and which tokens those are follows the rollout's entropy."""
    out = {}
    for tokens in ("all", "top_entropy"):
        tr = make_trainer(TokensCfg(algo="grpo", group_size=4, learn_tokens=tokens,
                                    top_entropy_quantile=0.3), critic_free=True)
        out[tokens] = tr.make_experience(*grouped_prompts(4, 4), torch.Generator().manual_seed(0))[0]
    every, top = out["all"], out["top_entropy"]
    assert torch.equal(every.sequences, top.sequences)
    mask = every.action_mask.bool()
    kept = top.advantages != 0
    assert kept.any() and (kept & mask).sum() < 0.5 * mask.sum()
    torch.testing.assert_close(top.advantages[kept], every.advantages[kept], rtol=0, atol=0)
    assert (every.advantages[mask & ~kept] != 0).any()           # something was left out


def test_every_loss_option_of_the_script_reaches_the_spec_by_name():
    """A LossSpec field is either an option of train_ppo.Config of the same name or one that
    DERIVED_FIELDS derives from the method; a non-default value of each such option changes
    the spec (so a new field of LossSpec needs no plumbing, and none can be dropped)."""
    options = {f.name: f for f in dataclasses.fields(train_ppo.Config)}
    changed = {"reduction": "sequence", "clip_range": 0.1, "entropy_coef": 0.01, "gamma": 0.9,
               "lam": 0.9, "group_size": 4, "dpo_beta": 0.5, "dpo_loss": "ipo",
               "learn_tokens": "top_entropy", "top_entropy_quantile": 0.5, "cov_ratio": 0.1,
               "clip_cov_low": 0.5, "clip_cov_high": 4.0, "kl_cov_coef": 0.5}
    for field in dataclasses.fields(LossSpec):
        if field.name in DERIVED_FIELDS:
            continue
        assert field.name in options, f"LossSpec.{field.name} is no option of train_ppo"
        base = train_ppo.Config()
        assert getattr(spec_of(base), field.name) == getattr(base, field.name)
        moved = dataclasses.replace(base, **{field.name: changed[field.name]})
        assert getattr(spec_of(moved), field.name) == changed[field.name], field.name
    # the derived ones follow the options they come from
    derived = {"advantages": dict(algo="grpo"), "policy_loss": dict(algo="grpo", ratio="sequence"),
               "kl_in": dict(kl_in="loss"), "kl_estimator": dict(kl_estimator="k2"),
               "clip_high": dict(clip_range_high=0.28)}
    assert set(derived) == set(DERIVED_FIELDS)
    for name, given in derived.items():
        base = dataclasses.replace(train_ppo.Config(), kl_in="reward", kl_estimator="k1")
        assert getattr(spec_of(dataclasses.replace(base, **given)), name) != getattr(spec_of(base), name), name
    for loss in ("clip_cov", "kl_cov"):  # --cov_loss picks the policy loss too
        assert spec_of(dataclasses.replace(train_ppo.Config(), cov_loss=loss)).policy_loss == loss


def test_every_entry_of_learn_tokens_is_an_option_value():
    for name in LEARN_TOKENS:
        cfg = train_ppo.Config(algo="grpo", learn_tokens=name)
        train_ppo.check_config(cfg)
        assert spec_of(cfg).learn_tokens == name


def test_negative_keeps_the_tokens_of_responses_whose_score_is_below_their_group():
    """A group of 4 (Dr. GRPO's baseline, the group mean): scores 1, 1, 0, 0. With the KL in
    the reward, the first right answer paid a KL of 0.9 nats (beta 1), more than the others':
    its KL-shaped advantage is negative. It is still a right answer and must not learn down;
    the wrong answers learn, with their whole (KL-shaped) advantage."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    placed = torch.zeros_like(mask)
    placed[torch.arange(4), mask.sum(-1).long() - 1] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    spec = LossSpec(advantages="dr_grpo", group_size=4)
    logprobs = torch.zeros_like(mask)
    logprobs[0, 0] = 0.9  # KL 0.9 against a reference of log-prob 0
    rewards, advantages, _ = experience_advantages(
        placed, logprobs * mask, torch.zeros_like(mask), torch.zeros_like(mask), mask,
        dataclasses.replace(spec, kl_estimator="k1"), kl_coef=1.0, entropy=torch.ones_like(mask))
    assert advantages[0, 0] < 0  # the KL-shaped advantage of a right answer: negative
    kept = LEARN_TOKENS["negative"](None, mask, spec, True, advantages, placed, torch.zeros_like(mask))
    assert torch.equal(kept, torch.tensor([[0.0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]]))
    _, learned, _ = experience_advantages(
        placed, logprobs * mask, torch.zeros_like(mask), torch.zeros_like(mask), mask,
        dataclasses.replace(spec, kl_estimator="k1", learn_tokens="negative"), kl_coef=1.0,
        entropy=torch.ones_like(mask))
    torch.testing.assert_close(learned, advantages * kept)


def test_every_entry_of_every_loss_table_is_reachable_from_the_command_line(monkeypatch):
    """Each entry of each role's table is some command line's entry: a run checked by the
    script (check_config) holds it in its LossSpec. Then a new entry of POLICY_LOSSES or
    ADVANTAGES, added to its table and nowhere else, is reachable as well."""
    from mingpt_rlhf import losses
    from mingpt_rlhf.machinery.cli import parse_config

    def reachable(role, entry):
        for algo in ("ppo", "grpo", "rloo", "reinforce++", "online_dpo", "distill"):
            teacher = ["--teacher_dir", "out/ppo"] if algo == "distill" else []
            argv = ["--algo", algo, *teacher, f"--{role}", entry]
            try:
                cfg = parse_config(train_ppo.Config, argv)
                train_ppo.check_config(cfg)
            except Exception:
                continue
            if getattr(spec_of(cfg), role) == entry:
                return True
        return False
    for role, table in losses.TABLES.items():
        for entry in table:
            assert reachable(role, entry), f"--{role} {entry} reaches no run"
    monkeypatch.setitem(losses.POLICY_LOSSES, "mine", losses.POLICY_LOSSES["token"])
    monkeypatch.setitem(losses.ADVANTAGES, "mine", losses.ADVANTAGES["reinforce++"])
    assert reachable("policy_loss", "mine") and reachable("advantages", "mine")


def test_no_derived_field_shadows_an_option_of_the_same_name():
    """A LossSpec field that the method derives (DERIVED_FIELDS) and that is also an option
    takes the option's value when it is given: an option named like a derived field is never
    silently overridden."""
    from mingpt_rlhf import losses
    options = {f.name for f in dataclasses.fields(train_ppo.Config)}
    shadowing = [name for name in DERIVED_FIELDS if name in options]
    assert set(shadowing) >= {"advantages", "policy_loss", "kl_in", "kl_estimator"}
    contexts = {"advantages": {"rloo": "rloo", "grpo": "grpo", "dr_grpo": "grpo", "gae": "ppo",
                               "reinforce++": "reinforce++", "preference": "online_dpo"},
                "policy_loss": {"token": "grpo", "sequence": "grpo", "clip_cov": "grpo",
                                "kl_cov": "grpo", "dpo": "online_dpo"}}
    for name in shadowing:
        for entry in losses.TABLES[name]:
            algo = contexts.get(name, {}).get(entry, "grpo")
            cfg = train_ppo.Config(algo=algo, **{name: entry})
            if name == "advantages" and entry == "grpo":
                cfg.kl_in = "loss"
            assert getattr(spec_of(cfg), name) == entry, (name, entry)
