"""Stale samples (mingpt_rlhf/lab/offpolicy.py): every correction against a hand computation, the
trainer applying the run's entry, a sampler exactly N updates behind, the queue's memory, and
exact resume at the largest lag. The expected gradient of each correction at a lagging sampler
is tests/test_gradients.py's business (a row per entry)."""
import copy
import math
from dataclasses import dataclass

import pytest
import torch

import conftest
import train_ppo
from mingpt_rlhf import ppo_trainer
from mingpt_rlhf.machinery import cli
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.losses import spec_of
from mingpt_rlhf.lab.offpolicy import (DEFAULT_CAP, MAX_LAG, OFFPOLICY, READS_CAP, SamplerQueue, cap_of,
                                       correct, resolved_offpolicy)
from test_critic_free import grouped_prompts
from test_ppo_trainer import Cfg, make_trainer
from test_scripts import assert_same_weights, killed_after_first_save, ppo_cfg

# three tokens of one response and a PAD: log pi_prox - log mu = log 2, log 1/2, log 1.1, (pad)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
LEARNER = SAMPLER + torch.log(torch.tensor([[2.0, 0.5, 1.1, 1.0]])) * MASK


@dataclass
class LagCfg(Cfg):
    offpolicy: str = "auto"
    ratio: str = "token"


@pytest.mark.parametrize("name,cap,old,weights", [
    ("none", 0.0, LEARNER, None),
    ("clip", 0.0, SAMPLER, None),
    ("gspo", 0.0, SAMPLER, None),
    ("decoupled", 0.0, LEARNER, [2.0, 0.5, 1.1, 1.0]),
    ("decoupled", 1.5, LEARNER, [1.5, 0.5, 1.1, 1.0]),
    ("tis", 1.5, LEARNER, [1.5, 0.5, 1.1, 1.0]),
    ("mask", 1.5, LEARNER, [0.0, 0.0, 1.1, 1.0]),      # 2 > 1.5 and 0.5 < 1 / 1.5: dropped
    ("mask", 2.0, LEARNER, [2.0, 0.5, 1.1, 1.0]),      # [0.5, 2] keeps both ends
])
def test_each_correction_by_hand(name, cap, old, weights):
    (got_old, got_weights), figures = correct(name, LEARNER, SAMPLER, MASK, cap)
    assert torch.equal(got_old, old)
    if weights is None:
        assert got_weights is None
    else:
        torch.testing.assert_close(got_weights, torch.tensor([weights]))
    # over the 3 real tokens: mean |log r| and mean (r - 1) - log r, r = 2, 0.5, 1.1
    r = torch.tensor([2.0, 0.5, 1.1])
    assert figures["mismatch_abs"] == pytest.approx(r.log().abs().mean().item(), rel=1e-5)
    assert figures["mismatch_kl"] == pytest.approx(((r - 1) - r.log()).mean().item(), rel=1e-5)
    changed = 0 if weights is None else sum(abs(w - x) > 1e-6 for w, x in zip(weights[:3], r.tolist()))
    assert figures["is_cut"] == pytest.approx(changed / 3)


def test_the_entries_that_read_the_cap_are_those_whose_weights_it_changes():
    """READS_CAP, which decides where --tis_cap is taken (rl_options.READ_ONLY_WITH), is what
    the entries do: none, clip and gspo weigh no token, so a cap changes nothing of theirs."""
    def outcome(name, cap):  # the ratio's denominator and the weights (1 for "no weight")
        old, weights = correct(name, LEARNER, SAMPLER, MASK, cap)[0]
        return torch.cat([old, torch.ones_like(old) if weights is None else weights])
    changed = {name for name in OFFPOLICY if not torch.equal(outcome(name, 1.5), outcome(name, 3.0))}
    assert changed == set(READS_CAP)


@pytest.mark.parametrize("offpolicy", ["none", "clip", "gspo"])
def test_a_cap_with_a_correction_that_weighs_no_token_is_refused(tmp_path, capsys, offpolicy):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), "--algo", "grpo",
                                                  "--sampler_lag", "1", "--offpolicy", offpolicy,
                                                  "--tis_cap", "2"])
    assert "--tis_cap 2.0 would be ignored: it is read only with --offpolicy decoupled, tis or mask" in line, line


@pytest.mark.parametrize("argv,refused", [
    (["--offpolicy", "tis"], True), (["--offpolicy", "decoupled"], True),
    (["--offpolicy", "mask"], True), (["--tis_cap", "2"], True),
    (["--offpolicy", "clip"], False), (["--offpolicy", "none"], False), (["--offpolicy", "gspo"], False)])
def test_gspos_ratio_with_a_correction_that_weighs_tokens_is_refused(argv, refused):
    cfg = cli.parse_config(train_ppo.Config, ["--algo", "grpo", "--ratio", "sequence",
                                              "--sampler_lag", "1", *argv])
    if not refused:
        train_ppo.check_config(cfg)
        return
    with pytest.raises(UserError) as e:
        train_ppo.check_config(cfg)
    assert "--offpolicy gspo or clip" in str(e.value) and "--ratio token" in str(e.value)
    with pytest.raises(ValueError, match="not its importance weight"):  # a PPOTrainer caller
        ppo_trainer.resolve_auto_options(LagCfg(algo="grpo", ratio="sequence", offpolicy="tis"))


def test_a_responses_importance_weight_is_the_product_of_its_tokens_not_their_mean():
    """Why GSPO refuses a per-token correction, in the oracle's world (every response listed):
    the sampler one update behind the learner (gradients.evaluation_point). GSPO's loss weighs
    each response as a whole; reweighed by the product of its tokens' weights pi / mu (the
    response's own ratio), the sampler's responses are the learner's exactly, and by the mean
    of the weights, which is what the trainer's sequence loss would take (seen through its own
    gradient, losses.token_weights), they are not. docs/offpolicy.md quotes these numbers."""
    from mingpt_rlhf.lab.gradients import evaluation_point
    from mingpt_rlhf.logprobs import sequence_logprobs
    from mingpt_rlhf.losses import LossSpec, token_weights
    from mingpt_rlhf.lab.tabular import MAX_LEN, PAD, TabularPolicy, make_world, response_batch
    world = make_world(0, 0.5)
    learner, sampler = evaluation_point(world)
    sequences, attention_mask, mask = response_batch()

    def per_token(table):  # (Y, N) log-probs of every response's tokens
        return sequence_logprobs(TabularPolicy(table), sequences, attention_mask, 1, suppress=PAD)[0] * mask
    logp, logmu = per_token(learner).detach(), per_token(sampler).detach()
    w = torch.where(mask.bool(), (logp - logmu).exp(), 1.0)                    # (Y, N)
    # GSPO at ratio 1 with advantages A x w (A = 1): the weight of each response in the loss
    spec = LossSpec(advantages="rloo", policy_loss="sequence", reduction="sequence")
    per_response = token_weights(logp, logp, logp, w * mask, mask, spec, 0.0, MAX_LEN)["weight"].sum(-1)
    mean = (w * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(per_response.double(), mean, rtol=1e-5, atol=0)
    pi, mu, reward = logp.sum(-1).exp(), logmu.sum(-1).exp(), world.reward
    torch.testing.assert_close(mu * w.prod(-1), pi)                # the product: exactly the learner's
    learners = (pi * reward).sum().item()
    assert (mu * w.prod(-1) * reward).sum().item() == pytest.approx(learners, abs=1e-12)
    by_mean, unweighed = (mu * mean * reward).sum().item(), (mu * reward).sum().item()
    assert (round(learners, 3), round(by_mean, 3), round(unweighed, 3)) == (-0.083, -0.153, -0.199)
    assert (mu * mean).sum().item() > 1.01                          # not even a distribution


def test_auto_and_the_cap_resolve_as_documented():
    assert resolved_offpolicy(LagCfg()) == "none" and cap_of(LagCfg()) == 0.0
    assert resolved_offpolicy(LagCfg(tis_cap=3.0)) == "tis" and cap_of(LagCfg(tis_cap=3.0)) == 3.0
    assert cap_of(LagCfg(offpolicy="mask")) == cap_of(LagCfg(offpolicy="tis")) == DEFAULT_CAP
    assert cap_of(LagCfg(offpolicy="decoupled")) == 0.0                 # decoupled: no cap
    assert resolved_offpolicy(Cfg()) == "none"                          # a config without it
    gspo = ppo_trainer.resolve_auto_options(LagCfg(algo="grpo", offpolicy="gspo"))
    assert gspo.ratio == "sequence" and gspo.reduction == "sequence"
    assert spec_of(gspo).policy_loss == "sequence" and spec_of(LagCfg(algo="grpo", offpolicy="tis",
                                                                      reduction="budget")).policy_loss == "token"


def lagging_trainer(offpolicy, lag=1, cap=0.0, steps=2):
    """A GRPO trainer whose sampler is `lag` updates behind after `steps` updates."""
    tr = make_trainer(ppo_trainer.resolve_auto_options(
        LagCfg(algo="grpo", group_size=4, sampler_lag=lag, offpolicy=offpolicy, tis_cap=cap,
               actor_lr=3e-2)), critic_free=True)
    for i in range(steps):
        tr.step([grouped_prompts(4, 4, seed=10 + i)], torch.Generator().manual_seed(i))
    return tr


@pytest.mark.parametrize("name", list(OFFPOLICY))
def test_the_trainer_applies_the_runs_correction(name):
    """The same stale rollout (same weights, same samples) scored under each entry: the
    experience's old log-probs are the sampler's for clip and gspo, the learner's otherwise,
    and its advantages are the uncorrected ones times the entry's weights."""
    batch = grouped_prompts(4, 4, seed=3)
    tr = lagging_trainer("none")
    base, _ = tr.make_experience(*batch, torch.Generator().manual_seed(7))
    tr.offpolicy, tr.is_cap = name, (1.5 if name in ("decoupled", "tis", "mask") else 0.0)
    exp, stats = tr.make_experience(*batch, torch.Generator().manual_seed(7))
    with tr.queue.sampling(tr.actor, True):
        sampled = tr.sample(*batch, torch.Generator().manual_seed(7), score=True)
    mask = exp.action_mask
    assert torch.equal(exp.sequences, base.sequences) and stats["mismatch_kl"] > 1e-4
    learner, sampler = base.logprobs, sampled.logprobs.float() * mask
    (old, weights), _ = correct(name, learner, sampler, mask, tr.is_cap)
    torch.testing.assert_close(exp.logprobs, sampler if name in ("clip", "gspo") else learner)
    expected = base.advantages if weights is None else base.advantages * weights
    torch.testing.assert_close(exp.advantages, expected)


@pytest.mark.parametrize("lag", [1, 3])
def test_the_sampler_writes_with_the_weights_of_lag_updates_ago(lag):
    """After k updates the rollout is sampled with theta_{k - lag} (theta_0 while the queue
    fills): the same tokens as a copy of the actor holding those weights. The queue holds at
    most `lag` copies, and the actor has its own weights back after sampling."""
    tr = make_trainer(Cfg(algo="grpo", group_size=4, sampler_lag=lag, actor_lr=3e-2), critic_free=True)
    history = [[p.detach().clone() for p in ppo_trainer.trainable(tr.actor)]]   # theta_0, theta_1, ...
    batch = grouped_prompts(4, 4, seed=3)
    for k in range(lag + 2):
        expected_weights = history[max(0, k - lag)]
        behind = copy.deepcopy(tr.actor)
        with torch.no_grad():
            for p, w in zip(ppo_trainer.trainable(behind), expected_weights):
                p.copy_(w)
        other = make_trainer(Cfg(algo="grpo", group_size=4), critic_free=True)
        other.actor = behind
        want = other.sample(*batch, torch.Generator().manual_seed(k))
        with tr.queue.sampling(tr.actor, True):
            got = tr.sample(*batch, torch.Generator().manual_seed(k))
        assert torch.equal(got.sequences, want.sequences), k
        tr.step([grouped_prompts(4, 4, seed=20 + k)], torch.Generator().manual_seed(k))
        history.append([p.detach().clone() for p in ppo_trainer.trainable(tr.actor)])
        assert len(tr.queue.copies) == min(k + 1, lag)
        assert not all(torch.equal(a, b) for a, b in zip(history[-1], history[-2]))  # it learned


def test_the_queue_keeps_lag_copies_and_loads_an_old_single_copy():
    q = SamplerQueue(2)
    for i in range(5):
        q.push([torch.full((2,), float(i))])
    assert [c[0][0].item() for c in q.state()] == [3.0, 4.0] and q.oldest()[0][0].item() == 3.0
    fresh = SamplerQueue(1)
    assert fresh.load([torch.zeros(2)], [torch.Size([2])])            # before the queue: one list
    assert len(fresh.copies) == 1
    assert not SamplerQueue(1).load(q.state(), [torch.Size([2])])      # 2 copies for lag 1
    assert not SamplerQueue(2).load(q.state(), [torch.Size([3])])      # another model
    assert SamplerQueue(0).oldest() is None
    SamplerQueue(0).push([torch.zeros(2)])                             # lag 0 keeps nothing


def test_resume_at_the_largest_lag_is_exact(stages, tmp_path):
    """Killed after its checkpoint at step 10 with a queue of 8 copies, resumed to 12: the same
    weights as the run never stopped, and the stale rollouts logged the same mismatch."""
    root = stages[0]
    kw = dict(algo="grpo", group_size=4, sampler_lag=MAX_LAG, offpolicy="decoupled",
              max_iters=12, eval_interval=10, rollout_batch_size=8, minibatch_size=8,
              ppo_epochs=1, max_new_tokens=8, eval_prompts=8, actor_lr=1e-3)
    straight = train_ppo.main(ppo_cfg(tmp_path / "straight", root / "sft", root / "rm", **kw))
    killed_after_first_save(train_ppo, ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", **kw))
    saved = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert saved["step"] == 10 and len(saved["sampler_behind"]) == MAX_LAG
    resumed = train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True, **kw))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert_same_weights(a["actor"], b["actor"])
    assert resumed["gold"] == straight["gold"] and math.isfinite(straight["kl"])


@pytest.mark.parametrize("argv,needle", [
    (["--sampler_lag", "9"], "--sampler_lag must be 0 .. 8"),
    (["--offpolicy", "bogus"], "--offpolicy must be auto or one of"),
    (["--offpolicy", "gspo", "--algo", "ppo"], "--algo grpo or rloo"),
    (["--offpolicy", "clip", "--dtype", "float32"], "in float32 the sampler's are the learner's"),
])
def test_impossible_lag_options_exit_2(tmp_path, capsys, argv, needle):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), *argv])
    assert needle in line, line


@pytest.mark.parametrize("name", list(OFFPOLICY))
def test_the_early_stop_measures_the_update_not_the_samplers_lag(name):
    """approx-KL, which stops an update past --target_kl, is the move from where the update
    started (the learner's own pass), for every correction. Measured against the sampler (the
    ratio's denominator under clip and gspo), a lag alone could pass the target before any
    step: with this trainer, clip then stepped [1, 0, 1, 0] times in 4 iterations and logged
    no approx_kl for the idle ones. Every iteration's first minibatch now steps, and every
    iteration logs its figures and the approx-KL that stopped it."""
    tr = make_trainer(ppo_trainer.resolve_auto_options(
        LagCfg(algo="grpo", group_size=4, sampler_lag=1, offpolicy=name, target_kl=0.02,
               actor_lr=3e-2, tis_cap=2.0 if name in ("tis", "mask", "decoupled") else 0.0)),
        critic_free=True)
    iterations = [tr.step([grouped_prompts(4, 4, seed=10 + i)], torch.Generator().manual_seed(i))[1]
                  for i in range(4)]
    assert all(stats["minibatch_steps"] >= 1 for stats in iterations), \
        [stats["minibatch_steps"] for stats in iterations]
    for stats in iterations:
        assert {"pg_loss", "clipfrac", "approx_kl", "early_stop_kl"} <= set(stats)
        stopped = stats["minibatch_steps"] < tr.cfg.ppo_epochs * 16 // tr.cfg.minibatch_size
        assert (stats["early_stop_kl"] > 0.02) == stopped, stats
    # the sampler's gap alone would have stopped some updates
    assert max(stats["mismatch_kl"] for stats in iterations) > 0.02
