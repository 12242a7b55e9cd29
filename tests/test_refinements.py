"""The refinements of GRPO and PPO (mingpt_rlhf/lab/refinements.py): each against a hand
computation, and each option of train_ppo.py reaching the update."""
import math

import pytest
import torch

import conftest
import train_ppo
from mingpt_rlhf import losses, ppo_trainer
from mingpt_rlhf.lab import refinements
from mingpt_rlhf.machinery import cli
from mingpt_rlhf.ppo import policy_loss
from mingpt_rlhf.ppo import align_and_cat
from mingpt_rlhf.lab.refinements import (informative_groups, overlong_penalty, reinforce_pp_advantages,
                                         sequence_policy_loss)
from test_scripts import ppo_cfg, read_metrics


def test_clip_higher_lets_a_ratio_rise_further_and_fall_no_further():
    """One token each. A = +1, ratio 1.25: the symmetric clip (0.2) stops it at 1.2, clip-higher
    (0.28) does not. A = -1, ratio 0.75: the lower clip (0.8) holds either way."""
    mask = torch.ones(1, 1)
    up = torch.tensor([[math.log(1.25)]])
    down = torch.tensor([[math.log(0.75)]])
    zero = torch.zeros(1, 1)
    assert policy_loss(up, zero, torch.ones(1, 1), mask, 0.2)[0].item() == pytest.approx(-1.2)
    assert policy_loss(up, zero, torch.ones(1, 1), mask, 0.2, clip_high=0.28)[0].item() == pytest.approx(-1.25)
    for high in (None, 0.28):
        assert policy_loss(down, zero, -torch.ones(1, 1), mask, 0.2, clip_high=high)[0].item() \
            == pytest.approx(0.8)


def test_gspo_clips_one_ratio_per_sequence():
    """Sequence 1: log-ratios 0.05 and 0.25, mean 0.15, s = e^0.15 = 1.1618, A = 1, clipped to 1.1:
    loss -1.1 (no gradient). Sequence 2: one token, log-ratio -0.2, s = 0.8187, A = 2, the
    clip [0.9, 1.1] would lower the loss to -1.8 but the max keeps -1.6375. Mean of the two."""
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.05, 0.25], [-0.2, 5.0]], requires_grad=True)  # 5.0: padding, masked
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, 2.0])
    loss, clipfrac = sequence_policy_loss(new, old, adv, mask, 0.1, 0.1)
    s2 = math.exp(-0.2)
    assert loss.item() == pytest.approx((-1.1 - 2 * s2) / 2, abs=1e-6)
    assert clipfrac.item() == 0.5
    loss.backward()
    assert (new.grad[0] == 0).all()                               # the clipped sequence
    assert new.grad[1, 0].item() == pytest.approx(-2 * s2 / 2)    # d(-A s)/d logp, / 2 sequences
    assert new.grad[1, 1] == 0                                    # padding
    # per token, sequence 1's first token (ratio 1.051) is not clipped: -(1.051 + 1.1) / 2
    token = policy_loss(new, old, adv[:, None] * mask, mask, 0.1, "sequence")[0]
    assert token.item() == pytest.approx((-(math.exp(0.05) + 1.1) / 2 - 2 * s2) / 2, abs=1e-6)


def test_gspo_ratio_is_the_geometric_mean_of_a_long_sequences_token_ratios():
    """Sequence 1 has three tokens and stays inside the clip: log-ratios 0.02, -0.01, 0.05,
    mean 0.02, s = e^0.02 = 1.0202 (their sum would give e^0.06 = 1.0618, also unclipped);
    A = 1.5, loss -1.5 s, and each token's gradient is -A s / 3 (the mean), / 2 sequences.
    Sequence 2: log-ratios 0.1, -0.3, mean -0.1, s = 0.9048, A = -1: the lower clip 1 - 0.05
    holds it at 0.95 (clip_low 0.05, clip_high 0.1: swapped, 0.9048 would pass unclipped)."""
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.02, -0.01, 0.05], [0.1, -0.3, 9.0]], requires_grad=True)  # 9.0: padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.5, -1.0])
    loss, clipfrac = sequence_policy_loss(new, old, adv, mask, 0.05, 0.1)
    s1 = math.exp(0.02)
    assert loss.item() == pytest.approx((-1.5 * s1 + 0.95) / 2, abs=1e-6)
    assert clipfrac.item() == 0.5
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-1.5 * s1 / 3 / 2] * 3, [0.0, 0.0, 0.0]]))


def test_overlong_penalty_ramps_to_minus_one_at_the_budget():
    lengths = torch.tensor([5, 6, 7, 9, 10])
    assert overlong_penalty(lengths, 10, 4).tolist() == pytest.approx([0, 0, -0.25, -0.75, -1])
    assert overlong_penalty(lengths, 10, 0).tolist() == [0] * 5


def test_reinforce_pp_returns_are_whitened_over_the_whole_batch():
    """Returns-to-go: row 0 [0.9, 0.8, 1.0], row 1 [0.5]; over the batch's four real tokens
    the mean is 0.8 and the (population) std sqrt(0.035)."""
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = reinforce_pp_advantages(rewards, mask)
    std = math.sqrt(0.035)
    expected = [[0.1 / std, 0.0, 0.2 / std], [-0.3 / std, 0, 0]]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-4, rtol=0)


def test_reinforce_pp_returns_are_discounted_by_gamma():
    """gamma 0.5, by hand: row 0 rewards [1, 2, 3] give returns [1 + 0.5 x 3.5, 2 + 0.5 x 3, 3]
    = [2.75, 3.5, 3]; row 1 [4, 1, pad] gives [4.5, 1]. Over the five real tokens the mean is
    2.95 and the (population) variance 6.55 / 5 = 1.31."""
    rewards = torch.tensor([[1.0, 2.0, 3.0], [4.0, 1.0, 7.0]])  # 7: padding, masked
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    returns = torch.tensor([[2.75, 3.5, 3.0], [4.5, 1.0, 0.0]])
    torch.testing.assert_close(adv, (returns - 2.95) / math.sqrt(1.31) * mask, atol=1e-5, rtol=0)


def test_informative_groups_are_those_whose_scores_differ():
    scores = torch.tensor([1.0, 1, 0, 1, 2, 2, 2, 2, 0, 0, 0, 1, -1, -1, -1, -1])
    assert informative_groups(scores, 4).tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert informative_groups(torch.zeros(6), 2).tolist() == []


# ----------------------------------------------------------------------------- in the trainer
from test_ppo_trainer import Cfg, make_trainer  # noqa: E402
from test_critic_free import grouped_prompts  # noqa: E402


def scripted_trainer(scores_per_call, dynamic):
    """A GRPO trainer (groups of 4) whose reward returns the given scores, one list per call;
    no EOS, so no response gets the missing-EOS penalty instead of its score. Records the
    rows each update learns from in `trainer.learned`."""
    tr = make_trainer(Cfg(algo="grpo", group_size=4, kl_in="loss", dynamic_sampling=dynamic),
                      critic_free=True)
    tr.eos_id = None
    calls = iter(scores_per_call)
    tr.reward_fn = lambda seqs, *a, **k: torch.tensor(next(calls), dtype=torch.float)
    tr.learned = []
    real_learn = tr.learn

    def learn(generator=None):
        tr.learned.append(align_and_cat(tr.buffer.batches, 0).scores.tolist()
                          if len(tr.buffer) else [])
        return real_learn(generator)
    tr.learn = learn
    return tr


TIE, SIGNAL = [0.0] * 4, [1.0, 0.0, 0.0, 0.0]


def test_dynamic_sampling_drops_groups_without_signal_and_refills():
    """Batch 1: one group of four has a signal; the refill gives three more, and the update
    learns from exactly those four groups (16 rows, as many as it asked for)."""
    tr = scripted_trainer([TIE + SIGNAL + TIE + TIE, [0, 0, 0, 2.0] + TIE + SIGNAL + SIGNAL], 2)
    refills = []
    exps, stats = tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0),
                          refill=lambda: refills.append(1) or grouped_prompts(4, 4, seed=2))
    assert len(refills) == 1 and len(exps) == 2          # every rollout is returned
    assert tr.learned == [SIGNAL + [0, 0, 0, 2.0] + SIGNAL + SIGNAL]
    assert stats["rollouts"] == 2 and stats["kept_rows"] == 16
    assert stats["dropped_groups"] == 4 / 8
    assert stats["gen_tokens"] == sum(e.action_mask.sum().item() for e in exps)  # both paid for


def test_dropped_groups_counts_only_groups_without_signal():
    """Two groups with a signal in batch 1 and four in the refill: 16 rows wanted, so two of the
    refill's groups are surplus and not learned from; they had a signal and are not 'dropped'."""
    tr = scripted_trainer([SIGNAL + SIGNAL + TIE + TIE, SIGNAL * 4], 2)
    _, stats = tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0),
                       refill=lambda: grouped_prompts(4, 4, seed=2))
    assert tr.learned == [SIGNAL * 4] and stats["kept_rows"] == 16
    assert stats["dropped_groups"] == 2 / 8 and stats["zero_groups"] == (0.5 + 0) / 2


def test_dynamic_sampling_stops_refilling_at_its_limit_and_may_skip_an_update():
    tr = scripted_trainer([TIE + SIGNAL + TIE + TIE, TIE * 4], 1)
    _, stats = tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0),
                       refill=lambda: grouped_prompts(4, 4, seed=2))
    assert tr.learned == [SIGNAL] and stats["rollouts"] == 2 and stats["minibatch_steps"] > 0
    tr = scripted_trainer([TIE * 4], 0)  # off: every group is learned from, ties included
    tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0))
    assert tr.learned == [TIE * 4]
    tr = scripted_trainer([TIE * 4, TIE * 4], 1)  # nothing kept: no update, and no error
    _, stats = tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0),
                       refill=lambda: grouped_prompts(4, 4, seed=2))
    assert tr.learned == [[]] and stats["minibatch_steps"] == 0 and len(tr.buffer) == 0


def test_a_lagging_sampler_samples_with_the_weights_of_one_update_ago():
    import copy
    tr = make_trainer(Cfg(algo="grpo", group_size=4, sampler_lag=1), critic_free=True)
    first = [p.detach().clone() for p in ppo_trainer.trainable(tr.actor)]
    tr.step([grouped_prompts(4, 4)], torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(tr.queue.oldest(), first))  # before the update
    behind = copy.deepcopy(tr.actor)
    with torch.no_grad():
        for p, old in zip(ppo_trainer.trainable(behind), tr.queue.oldest()):
            p.copy_(old)
    exp, _ = tr.make_experience(*grouped_prompts(4, 4, seed=3), torch.Generator().manual_seed(5))
    tr_behind = make_trainer(Cfg(algo="grpo", group_size=4), critic_free=True)
    tr_behind.actor = behind
    ref = tr_behind.sample(*grouped_prompts(4, 4, seed=3), torch.Generator().manual_seed(5))
    assert torch.equal(exp.sequences, ref.sequences)
    # the actor is back to its own weights afterwards, and an eval samples with them
    assert not all(torch.equal(p, old) for p, old in zip(ppo_trainer.trainable(tr.actor), tr.queue.oldest()))


def test_truncated_importance_sampling_weighs_each_token_by_learner_over_sampler():
    """With the sampler one update behind, its log-probs differ from the learner's. With
    --tis_cap each token's advantage is multiplied by min(exp(learner - sampler), cap); the
    same rollout without it is not. Two trainers, same seed: same weights (to rounding), same
    samples."""
    batch = grouped_prompts(4, 4)
    outs, sampled = {}, None
    for cap in (0.0, 1.05):
        tr = make_trainer(Cfg(algo="grpo", group_size=4, sampler_lag=1, tis_cap=cap),
                          critic_free=True)
        tr.step([grouped_prompts(4, 4, seed=2)], torch.Generator().manual_seed(0))
        outs[cap] = tr.make_experience(*batch, torch.Generator().manual_seed(1))
        with tr.queue.sampling(tr.actor, True):
            sampled = tr.sample(*batch, torch.Generator().manual_seed(1), score=True)
    (plain, plain_stats), (tis, stats) = outs[0.0], outs[1.05]
    # (the first update's weights were 1 to float rounding: the sampler was the learner then)
    assert torch.equal(plain.sequences, tis.sequences)
    torch.testing.assert_close(plain.logprobs, tis.logprobs)
    mask = tis.action_mask
    ratio = torch.exp((tis.logprobs - sampled.logprobs.float() * mask) * mask)
    assert stats["mismatch_kl"] > 0 and stats["is_cut"] > 0          # the mismatch is real
    assert plain_stats["mismatch_kl"] == pytest.approx(stats["mismatch_kl"], rel=1e-3)  # TIS or not
    expected = plain.advantages * torch.where(mask.bool(), ratio.clamp(max=1.05), 1.0)
    torch.testing.assert_close(tis.advantages, expected)
    assert not torch.equal(tis.advantages, plain.advantages)


@pytest.mark.parametrize("extra,seen", [
    (dict(algo="grpo", group_size=4, clip_range_high=0.28), "clip_high=0.28"),
    (dict(algo="grpo", group_size=4, ratio="sequence", clip_range=4e-4), "sequence"),
    (dict(algo="reinforce++"), "reinforce++"),
    (dict(algo="grpo", group_size=4, overlong_buffer=8), "overlong"),
    (dict(algo="grpo", group_size=4, dynamic_sampling=2), "informative"),
    (dict(algo="grpo", group_size=4, tis_cap=2.0, dtype="bfloat16"), "tis"),
    (dict(algo="ppo", tis_cap=2.0, sampler_lag=1), "tis"),
])
def test_each_refinement_reaches_the_update(stages, tmp_path, monkeypatch, extra, seen):
    root = stages[0]
    calls = []
    real_token, real_seq = losses.policy_loss, losses.sequence_policy_loss
    real_adv, real_over = losses.reinforce_pp_advantages, refinements.overlong_penalty
    real_info, real_tis = refinements.informative_groups, ppo_trainer.correct
    monkeypatch.setattr(refinements, "informative_groups", lambda *a, **k: (
        calls.append("informative"), real_info(*a, **k))[1])
    monkeypatch.setattr(ppo_trainer, "correct", lambda *a, **k: (
        calls.append(a[0]), real_tis(*a, **k))[1])
    monkeypatch.setattr(losses, "policy_loss", lambda *a, **k: (
        calls.append(f"clip_high={k.get('clip_high')}"), real_token(*a, **k))[1])
    monkeypatch.setattr(losses, "sequence_policy_loss", lambda *a, **k: (
        calls.append("sequence"), real_seq(*a, **k))[1])
    monkeypatch.setattr(losses, "reinforce_pp_advantages", lambda *a, **k: (
        calls.append("reinforce++"), real_adv(*a, **k))[1])
    monkeypatch.setattr(refinements, "overlong_penalty", lambda *a, **k: (
        calls.append("overlong"), real_over(*a, **k))[1])
    summary = train_ppo.main(ppo_cfg(tmp_path / "run", root / "sft", root / "rm", max_iters=2, **extra))
    assert seen in calls and summary["final"]
    rows = read_metrics(tmp_path / "run")
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize("argv,words", [
    (["--ratio", "sequence"], "needs one advantage per response"),
    (["--ratio", "word"], "--ratio must be token or sequence"),
    (["--overlong_buffer", "32"], "must be smaller than --max_new_tokens 32"),
    (["--clip_range_high", "-1"], "must be >= 0"),
    (["--overlong_buffer", "4", "--env", "guess"], "--overlong_buffer 4 would be ignored"),
    (["--dynamic_sampling", "2"], "read only with --algo grpo or rloo"),
    (["--dynamic_sampling", "-1"], "must be >= 0"),
    (["--tis_cap", "2", "--dtype", "float32"], "in float32 the sampler's are the learner's"),
    (["--sampler_lag", "9"], "--sampler_lag must be 0 .. 8"),
    (["--tis_cap", "0.5"], "use a cap >= 1"),
    (["--tis_cap", "2", "--env", "guess", "--mask_env", "false"], "environment's tokens have none"),
    (["--sampler_lag", "1", "--env", "guess", "--mask_env", "false"], "need the sampler's"),
    (["--algo", "grpo", "--ratio", "sequence", "--reduction", "budget"], "has its own reduction"),
    (["--algo", "rloo", "--ratio", "sequence", "--reduction", "token"], "drop --reduction token"),
])
def test_impossible_refinement_options_exit_2(tmp_path, capsys, argv, words):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), *argv])
    assert words in line, line


@pytest.mark.parametrize("argv", [["--algo", "grpo"], ["--algo", "grpo", "--grpo_norm", "grpo"],
                                  ["--algo", "rloo"], ["--algo", "grpo", "--reduction", "sequence"]])
def test_gspo_saves_the_reduction_it_trains_with(argv):
    """GSPO's loss is a mean over responses, whatever --reduction says: the resolved value the
    run prints and saves is "sequence", and so is the one the trainer uses (for the KL in the
    loss too)."""
    cfg = cli.parse_config(train_ppo.Config, [*argv, "--ratio", "sequence"])
    train_ppo.check_config(cfg)
    assert cfg.reduction == "sequence"
    assert make_trainer(cfg, critic_free=True).spec.reduction == "sequence"
