"""Why a collapsed group method stays collapsed with the KL in the reward, and comes back with
it in the loss (the duel game's failure, docs/troubleshooting.md), at tiny size.

The actor is the reference with its EOS logit raised at every position, so that it answers
every prompt with the empty response (EOS first), as the duel game's collapsed runs do, and
that answer scores 0 everywhere: every group of GRPO ties. With the KL in the reward, each
response of a group carries the same penalty, every advantage is 0, and one whole update
leaves the weights exactly where they were: nothing pulls the policy back. With the KL in the
loss its gradient does not go through the advantages, and the update lowers the empty
answer's probability towards the reference's."""
from dataclasses import dataclass, replace

import pytest
import torch

import train_ppo
from mingpt_rlhf.ppo_trainer import resolve_auto_options

from test_critic_free import grouped_prompts
from test_ppo_trainer import EOS, Cfg, make_trainer


@dataclass
class EnvCfg(Cfg):
    """A run whose rewards come from an environment (`--env`), every "auto" left to resolve."""
    reward: str = "env"
    kl_estimator: str = "auto"
    kl_coef: float = -1.0


def collapsed_trainer(kl_in: str, cfg=Cfg):
    def zero(sequences, attention_mask, action_mask, **fields):
        return torch.zeros(len(sequences))
    tr = make_trainer(replace(cfg(algo="grpo", group_size=4, kl_in=kl_in, missing_eos_penalty=0.0),
                              actor_lr=1e-2), critic_free=True)
    tr.reward_fn = zero
    with torch.no_grad():  # EOS first everywhere: the final layer norm's bias along EOS's row
        row = tr.actor.transformer.wte.weight[EOS]
        tr.actor.transformer.ln_f.bias += 10 * row / row.norm() ** 2   # +10 on its logit
    return tr


def eos_first(tr, ids, mask):
    """log p(EOS as the first token) of each prompt under the actor (B,)."""
    with torch.no_grad():
        hidden = tr.actor.trunk(ids, mask)[:, -1]
        return torch.log_softmax(tr.actor.logits(hidden).float(), -1)[:, EOS]


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_a_collapsed_group_comes_back_only_with_the_kl_in_the_loss(kl_in):
    tr = collapsed_trainer(kl_in)
    ids, mask = grouped_prompts(2, 4)
    before = eos_first(tr, ids, mask)
    weights = [p.detach().clone() for p in tr.actor.parameters()]
    (exp,), _ = tr.step([(ids, mask)], torch.Generator().manual_seed(0),
                        torch.Generator().manual_seed(1))
    assert (exp.action_mask.sum(-1) == 1).all() and (exp.sequences[:, -1] == EOS).all()
    assert before.min() > -1e-2   # the empty answer is nearly all of the probability
    after = eos_first(tr, ids, mask)
    if kl_in == "reward":  # every advantage 0: the update moved nothing
        assert (exp.advantages == 0).all()
        assert all(torch.equal(p, w) for p, w in zip(tr.actor.parameters(), weights))
    else:                  # pulled towards the reference, whose EOS-first is far less likely
        assert (after < before - 0.1).all(), (before, after)


@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo"])
def test_with_an_environment_the_kl_goes_in_the_loss(algo):
    """The default a user's game gets: the KL in the loss (k3) for ppo, grpo and rloo with
    --env; without --env, and for reinforce++ (whose KL in the reward is its paper's), the KL
    stays in the reward (k1)."""
    with_env = resolve_auto_options(EnvCfg(algo=algo, kl_in="auto"))
    assert (with_env.kl_in, with_env.kl_estimator) == ("loss", "k3")
    assert resolve_auto_options(replace(EnvCfg(algo=algo, kl_in="auto"), reward="rm")).kl_in == "reward"
    assert resolve_auto_options(EnvCfg(algo="reinforce++", kl_in="auto")).kl_in == "reward"
    assert resolve_auto_options(EnvCfg(algo=algo, kl_in="reward")).kl_in == "reward"  # as given


@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo", "reinforce++"])
def test_with_an_environment_the_group_methods_start_with_a_larger_kl_coefficient(algo):
    """--kl_coef auto: 0.2 for grpo and rloo with --env (their runs of the corridor game at
    0.05 could walk alike whatever the door), 0.05 for ppo and reinforce++ and without --env;
    a coefficient given is kept."""
    expected = 0.2 if algo in ("grpo", "rloo") else 0.05
    assert resolve_auto_options(EnvCfg(algo=algo)).kl_coef == expected
    assert resolve_auto_options(EnvCfg(algo=algo, reward="rm")).kl_coef == 0.05
    assert resolve_auto_options(EnvCfg(algo=algo, kl_coef=0.1)).kl_coef == 0.1
    run = train_ppo.Config(env="guess", algo=algo)
    train_ppo.check_config(run)          # what train_ppo.py trains with, saves and prints
    assert run.kl_coef == expected


def test_a_collapsed_game_comes_back_at_the_defaults():
    """The duel game's collapse at tiny size, with every KL option at its default and the
    rewards from an environment: the update moves the empty answer's probability back down
    (with the KL in the reward, the default before, it moved nothing)."""
    tr = collapsed_trainer("auto", cfg=EnvCfg)
    ids, mask = grouped_prompts(2, 4)
    before = eos_first(tr, ids, mask)
    tr.step([(ids, mask)], torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    assert (eos_first(tr, ids, mask) < before - 0.1).all()
