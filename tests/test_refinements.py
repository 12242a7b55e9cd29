"""The refinements of GRPO and PPO (mingpt_rlhf/refinements.py): each against a hand
computation, and each option of train_ppo.py reaching the update."""
import math

import pytest
import torch

import conftest
import train_ppo
from mingpt_rlhf import ppo_trainer
from mingpt_rlhf.ppo import policy_loss
from mingpt_rlhf.refinements import overlong_penalty, reinforce_pp_advantages, sequence_policy_loss
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
    loss, clipfrac, _ = sequence_policy_loss(new, old, adv, mask, 0.1, 0.1)
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


@pytest.mark.parametrize("extra,seen", [
    (dict(algo="grpo", group_size=4, clip_range_high=0.28), "clip_high=0.28"),
    (dict(algo="grpo", group_size=4, ratio="sequence", clip_range=4e-4), "sequence"),
    (dict(algo="reinforce++"), "reinforce++"),
    (dict(algo="grpo", group_size=4, overlong_buffer=8), "overlong"),
])
def test_each_refinement_reaches_the_update(stages, tmp_path, monkeypatch, extra, seen):
    root = stages[0]
    calls = []
    real_token, real_seq = ppo_trainer.policy_loss, ppo_trainer.sequence_policy_loss
    real_adv, real_over = ppo_trainer.reinforce_pp_advantages, ppo_trainer.overlong_penalty
    monkeypatch.setattr(ppo_trainer, "policy_loss", lambda *a, **k: (
        calls.append(f"clip_high={k.get('clip_high')}"), real_token(*a, **k))[1])
    monkeypatch.setattr(ppo_trainer, "sequence_policy_loss", lambda *a, **k: (
        calls.append("sequence"), real_seq(*a, **k))[1])
    monkeypatch.setattr(ppo_trainer, "reinforce_pp_advantages", lambda *a, **k: (
        calls.append("reinforce++"), real_adv(*a, **k))[1])
    monkeypatch.setattr(ppo_trainer, "overlong_penalty", lambda *a, **k: (
        calls.append("overlong"), real_over(*a, **k))[1])
    summary = train_ppo.main(ppo_cfg(tmp_path / "run", root / "sft", root / "rm", max_iters=2, **extra))
    assert seen in calls and summary["final"]
    rows = read_metrics(tmp_path / "run")
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize("argv,words", [
    (["--ratio", "sequence"], "needs one advantage per response"),
    (["--ratio", "word"], "--ratio must be token or sequence"),
    (["--algo", "reinforce++", "--kl_in", "loss"], "reinforce++ keeps the KL"),
    (["--overlong_buffer", "32"], "must be smaller than --max_new_tokens 32"),
    (["--clip_range_high", "-1"], "must be >= 0"),
    (["--overlong_buffer", "4", "--env", "guess"], "--overlong_buffer shapes single responses"),
])
def test_impossible_refinement_options_exit_2(tmp_path, capsys, argv, words):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), *argv])
    assert words in line, line
