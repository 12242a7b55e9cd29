"""The table of losses (mingpt_rlhf/losses.py) as the trainer uses it: every algorithm runs
every KL estimator in the reward and in the loss, each puts the estimator's own value where
it says, the defaults per algorithm are those of before the table, and the option reaches
the command line and the checkpoint. What each combination's gradient follows is
tests/test_gradients.py's business."""
import math
from dataclasses import dataclass, replace

import pytest
import torch

import train_ppo
from mingpt_rlhf.cli import build_parser
from mingpt_rlhf.errors import UserError
from mingpt_rlhf.losses import KL_ESTIMATORS, spec_of
from mingpt_rlhf.ppo import reduce_tokens
from mingpt_rlhf.ppo_trainer import resolve_auto_options
from test_ppo_trainer import Cfg, make_trainer, prompts
from test_scripts import ppo_cfg


@dataclass
class KLCfg(Cfg):
    kl_estimator: str = "auto"


def by_hand(estimator, logprobs, ref_logprobs):
    """Each estimator of KL(pi || ref) per token, from d = log pi - log ref."""
    d = logprobs - ref_logprobs
    return {"k1": d, "k2": d ** 2 / 2, "k3": torch.exp(-d) + d - 1}[estimator]


def moved_trainer(cfg):
    """A trainer whose actor is no longer its reference, so that every KL term is non-zero."""
    tr = make_trainer(cfg, shared=True, critic_free=cfg.algo != "ppo")
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for p in tr.actor.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return tr


ALGOS = ["ppo", "reinforce++", "rloo", "grpo"]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("kl_in", ["reward", "loss"])
@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_runs_every_estimator_in_the_reward_and_in_the_loss(algo, kl_in,
                                                                          estimator):
    """Two iterations of each of the 24 combinations. With the KL in the reward, each token's
    reward is the score (on the last token) minus beta x the estimator's value; in the loss,
    the first minibatch's KL term (the whole batch, ratio 1) is the estimator's value reduced
    like the surrogate. The KL logged is k1 summed over the response whatever the estimator
    (the adaptive beta reads it)."""
    cfg = KLCfg(algo=algo, kl_in=kl_in, kl_estimator=estimator, ppo_epochs=1,
                minibatch_size=16, max_new_tokens=6)
    tr = moved_trainer(cfg)
    assert tr.spec.kl_estimator == estimator and tr.spec.kl_in == kl_in
    ids, mask = prompts(4, seed=1)
    batch = (ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0))  # 4 groups of 4
    exp, stats = tr.make_experience(*batch, torch.Generator().manual_seed(0))
    m, beta = exp.action_mask, tr.kl_ctl.value
    value = by_hand(estimator, exp.logprobs, exp.ref_logprobs) * m
    assert value.abs().sum() > 1e-2  # the policies differ: the KL term means something
    assert stats["kl"] == pytest.approx(((exp.logprobs - exp.ref_logprobs) * m).sum(-1).mean().item(),
                                        rel=1e-5)
    placed = torch.zeros_like(m)
    placed[torch.arange(len(m)), (m * torch.arange(m.size(1))).argmax(-1)] = exp.scores
    expected = placed - beta * value if kl_in == "reward" else placed
    if algo in ("rloo", "grpo"):  # a group method keeps each response's total on its tokens
        expected = expected.sum(-1, keepdim=True) * m
    torch.testing.assert_close(exp.rewards, expected, atol=1e-6, rtol=0)

    tr.buffer.add(exp)
    out = tr.learn(torch.Generator().manual_seed(1))
    assert ("kl_loss" in out) == (kl_in == "loss")
    if kl_in == "loss":
        kl_loss = reduce_tokens(value, m, tr.spec.reduction, tr.budget)
        assert out["kl_loss"] == pytest.approx(kl_loss.item(), rel=1e-4, abs=1e-7)
    tr.step([batch], torch.Generator().manual_seed(2), torch.Generator().manual_seed(3))
    assert all(math.isfinite(v) for v in out.values())


def test_the_defaults_per_algorithm_are_those_before_the_table():
    """k1 in the reward for PPO, REINFORCE++, RLOO and Dr. GRPO; k3 in the loss for GRPO with
    the std (the paper's pairing); the other two options default to auto."""
    expected = {("ppo", "dr"): ("reward", "k1"), ("reinforce++", "dr"): ("reward", "k1"),
                ("rloo", "dr"): ("reward", "k1"), ("grpo", "dr"): ("reward", "k1"),
                ("grpo", "grpo"): ("loss", "k3")}
    for (algo, norm), pair in expected.items():
        cfg = resolve_auto_options(train_ppo.Config(algo=algo, grpo_norm=norm))
        assert (cfg.kl_in, cfg.kl_estimator) == pair, algo
        assert (spec_of(cfg).kl_in, spec_of(cfg).kl_estimator) == pair
    # an explicit placement keeps the estimator's default for it; an explicit estimator stays
    assert resolve_auto_options(train_ppo.Config(algo="rloo", kl_in="loss")).kl_estimator == "k3"
    assert resolve_auto_options(train_ppo.Config(kl_estimator="k2")).kl_estimator == "k2"
    # a caller's config without the option (an older script, a benchmark) gets the same
    assert spec_of(resolve_auto_options(Cfg(kl_in="loss", algo="rloo"))).kl_estimator == "k3"


def test_kl_estimator_is_an_option_with_help_and_a_refusal():
    help_text = build_parser(train_ppo.Config).format_help()
    assert "--kl_estimator" in help_text and all(k in help_text for k in KL_ESTIMATORS)
    with pytest.raises(UserError, match="--kl_estimator must be auto, k1, k2 or k3"):
        train_ppo.check_config(train_ppo.Config(kl_estimator="k4"))


def test_ppo_with_k2_in_the_loss_runs_and_saves_its_estimator(stages, tmp_path):
    """PPO takes the KL in the loss (refused before the table), and the checkpoint's config
    says which estimator the run used."""
    root = stages[0]
    out = tmp_path / "ppo_k2_loss"
    summary = train_ppo.main(ppo_cfg(out, root / "sft", root / "rm", max_iters=2,
                                     kl_in="loss", kl_estimator="k2"))
    assert summary["final"]
    config = torch.load(out / "ckpt.pt", weights_only=False)["config"]
    assert (config["kl_in"], config["kl_estimator"]) == ("loss", "k2")
    auto = replace(train_ppo.Config(), algo="grpo", grpo_norm="grpo")
    train_ppo.check_config(auto)
    assert auto.kl_estimator == "k3"  # the resolved value is the one printed and saved
