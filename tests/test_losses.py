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
from mingpt_rlhf.machinery.cli import build_parser
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.losses import KL_ESTIMATORS, LossSpec, spec_of
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
    with pytest.raises(UserError, match="--kl_estimator must be one of auto, k1, k2, k3, got 'k4'"):
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


# ----------------------------------------------------------------------------- token weights
def weight_batch():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1.]])
    old = torch.randn(3, 4) * 0.3 - 1
    ref = old + 0.3 * torch.randn(3, 4)
    adv = torch.randn(3, 4) * mask
    return old, ref, adv, mask


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("reduction", ["token", "sequence", "budget"])
def test_token_weights_at_ratio_one_are_advantage_x_normaliser_plus_the_kl_share(estimator, reduction):
    """At the first minibatch (ratio 1) token t of response i is weighted A_t x c_i, where c_i
    is what the reduction gives it per response (token: B / all tokens; sequence: 1 / n_i;
    budget: 1 / budget), and the KL in the loss adds -beta c_i d k / d log pi: k1 -> 1,
    k2 -> d, k3 -> 1 - e^(-d), with d = log pi - log ref."""
    from mingpt_rlhf.losses import LossSpec, token_weights
    old, ref, adv, mask = weight_batch()
    beta, budget = 0.1, 5
    spec = LossSpec(reduction=reduction, kl_in="loss", kl_estimator=estimator)
    w = token_weights(old, old, ref, adv, mask, spec, beta, budget)
    n = mask.sum(-1, keepdim=True)
    c = {"token": 3 / mask.sum() * torch.ones_like(n), "sequence": 1 / n,
         "budget": torch.full_like(n, 1 / budget)}[reduction] * mask
    d = old - ref
    slope = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d)}[estimator]
    torch.testing.assert_close(w["normaliser"], c)
    torch.testing.assert_close(w["surrogate"], adv * c)
    torch.testing.assert_close(w["kl"], -beta * c * slope * mask)
    torch.testing.assert_close(w["weight"], adv * c - beta * c * slope * mask)
    torch.testing.assert_close(w["ratio"], mask)


def test_a_clipped_token_has_no_surrogate_weight_and_an_unclipped_one_its_ratio():
    """Past the clip on the side its advantage pushes, a token's gradient is cut (weight 0);
    inside it the weight is A x ratio x normaliser; the KL in the reward adds nothing."""
    from mingpt_rlhf.losses import LossSpec, token_weights
    old, ref, adv, mask = weight_batch()
    adv = torch.where(mask.bool(), torch.tensor(1.0), 0.0)        # every advantage positive
    new = old.clone()
    new[0, 0] += 0.5                                              # ratio 1.65 > 1.2: clipped
    new[0, 1] += 0.1                                              # ratio 1.105: inside
    new[0, 2] -= 0.5                                              # 0.61 < 0.8, A > 0: not clipped
    w = token_weights(new, old, ref, adv, mask, LossSpec(), 0.1, 5)
    c = 3 / mask.sum()
    assert w["weight"][0, 0] == 0 and torch.equal(w["kl"], torch.zeros_like(w["kl"]))
    torch.testing.assert_close(w["weight"][0, 1:3], c * torch.exp(torch.tensor([0.1, -0.5])))


def test_gspo_gives_every_token_of_a_response_its_sequence_ratio_over_its_length():
    from mingpt_rlhf.losses import LossSpec, token_weights
    old, ref, adv, mask = weight_batch()
    adv = torch.tensor([[0.5], [-1.0], [2.0]]) * mask             # one advantage per response
    new = old + 0.05 * mask
    spec = LossSpec(policy_loss="sequence", reduction="sequence", clip_range=0.3, clip_high=0.3)
    w = token_weights(new, old, ref, adv, mask, spec, 0.1, 5)
    n = mask.sum(-1, keepdim=True)
    ratio = torch.exp(torch.tensor(0.05))                         # the mean log-ratio's exp
    torch.testing.assert_close(w["weight"], adv * ratio / n * mask)
    torch.testing.assert_close(w["ratio"], ratio * mask)


def test_cispo_by_hand():
    """CISPO's loss is -sg(clip(r)) x A x log pi, reduced like any other; its gradient on each
    token is -clip(r) x A / tokens, so a token whose ratio passed the clip keeps a gradient
    (PPO's clip gives it none). Two responses, 3 + 2 real tokens, clip 0.2, token mean."""
    from mingpt_rlhf.losses import POLICY_LOSSES
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]])
    log_ratio = torch.tensor([[0.5, 0.0, -0.5], [0.1, -0.1, 0.0]])   # ratios e^0.5 = 1.65 ...
    adv = torch.tensor([[1.0, -1.0, 2.0], [-2.0, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    spec = LossSpec(policy_loss="cispo", clip_range=0.2, clip_high=0.2, reduction="token")
    x = logp.clone().requires_grad_(True)
    loss, clipfrac = POLICY_LOSSES["cispo"](x, logp - log_ratio, None, adv, mask, spec, 3, None)
    weight = [[1.2, 1.0, 0.8], [math.exp(0.1), math.exp(-0.1), 0.0]]  # clipped to [0.8, 1.2]
    expected = -sum(w * a * lp
                    for rw, ra, rl, rm in zip(weight, adv.tolist(), logp.tolist(), mask.tolist())
                    for w, a, lp, m in zip(rw, ra, rl, rm) if m) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert clipfrac.item() == pytest.approx(2 / 5)  # the first and third tokens of row 0
    loss.backward()
    torch.testing.assert_close(x.grad, -torch.tensor(weight) * adv * mask / 5)
    assert x.grad[0, 0] != 0  # past the clip, still learning (PPO's would be 0: A > 0, r > 1.2)
