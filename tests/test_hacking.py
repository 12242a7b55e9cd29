"""The reward-hacking signals on hand-made histories, the rule firing (or not) on constructed
runs, the monitor's one message, and the held-out reward model's gap."""
import pytest
import torch

from mingpt_rlhf.lab.hacking import (ALARM_KL, THRESHOLDS, HackingMonitor, HeldOutGap, fired,
                                     first_warning, signals, warns)


def rows(**series):
    """Rows of a history from equal-length lists, one per logged figure; steps 1, 2, ..."""
    n = len(next(iter(series.values())))
    return [{"step": i + 1, **{k: v[i] for k, v in series.items()}} for i in range(n)]


def test_each_signal_on_a_hand_made_history():
    """W = 2, six iterations. kl windows 0, 1, 3: acceleration (3 - 1) - (1 - 0) = 1;
    length from 10 to 15: +0.5; entropy's last four 2.0, 1.9, 1.8, 1.7: slope -0.1 over the
    first window's 2.0: -0.05; members' spread from 0.2 to 0.5: +1.5; gap from 0.1 to 0.9: +0.8;
    the KL's level, the last window's mean: 3."""
    history = rows(kl=[0, 0, 1, 1, 3, 3], resp_len=[10, 10, 12, 12, 15, 15],
                   entropy=[2.0, 2.0, 2.0, 1.9, 1.8, 1.7], ens_std=[0.2, 0.2, 0.3, 0.3, 0.5, 0.5],
                   heldout_gap=[0.1, 0.1, 0.5, 0.5, 0.9, 0.9])
    got = signals(history, 2)
    expected = {"kl_accel": 1.0, "kl_level": 3.0, "length_drift": 0.5, "entropy_trend": -0.05,
                "disagreement": 1.5, "heldout_gap": 0.8}
    assert set(got) == set(THRESHOLDS) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value), name


def test_signals_wait_for_three_windows_and_skip_what_is_not_logged():
    history = rows(kl=[0.0] * 5, resp_len=[10] * 5, entropy=[2.0] * 5)
    assert all(v is None for v in signals(history, 2).values())       # 5 < 3 x 2
    six = rows(kl=[0.0] * 6, resp_len=[10] * 6, entropy=[2.0] * 6)
    got = signals(six, 2)
    assert got["disagreement"] is None and got["heldout_gap"] is None  # no ensemble, no held-out
    assert got["kl_accel"] == 0 and got["length_drift"] == 0 and got["entropy_trend"] == 0
    assert got["kl_level"] == 0


@pytest.mark.parametrize("name", list(THRESHOLDS))
def test_each_threshold_fires_past_it_and_not_before(name):
    threshold, direction = THRESHOLDS[name]
    step = abs(threshold) * 0.1
    beyond = threshold + step if direction >= 0 else threshold - step
    within = threshold - step if direction >= 0 else threshold + step
    assert fired({name: beyond}) == [name]
    assert fired({name: within}) == []
    if direction == 0:  # either way
        assert fired({name: -beyond}) == [name]


def test_the_rule_is_the_kl_level_alone():
    """Every other signal far past its threshold does not make the alarm; the KL's level does."""
    others = {name: 10 * th for name, (th, _) in THRESHOLDS.items() if name != "kl_level"}
    assert len(fired(others)) == len(THRESHOLDS) - 1 and not warns(others)
    assert warns({"kl_level": ALARM_KL + 0.1}) and not warns({"kl_level": ALARM_KL - 0.1})


def healthy_run(n=60):
    """KL rising at a steady 0.1 nats per iteration, the length flat with noise, the entropy
    losing 0.1 % of itself per iteration: a run that optimises without hacking."""
    g = torch.Generator().manual_seed(0)
    noise = (torch.rand(n, generator=g) - 0.5).tolist()
    return rows(kl=[0.1 * t for t in range(n)], resp_len=[12 + noise[t] for t in range(n)],
                entropy=[2.0 * 0.999 ** t for t in range(n)])


def hacking_run(n=60, turn=30):
    """The healthy run until `turn`, then the policy finds an exploit and runs away, as the
    study's collapsing runs did: the KL speeds up to 2 nats per iteration and the responses
    grow by half a word per iteration."""
    history = healthy_run(n)
    for t in range(turn, n):
        history[t]["kl"] = 0.1 * turn + 2.0 * (t - turn)
        history[t]["resp_len"] += 0.5 * (t - turn)
    return history


def test_the_rule_stays_quiet_on_a_healthy_run():
    assert first_warning(healthy_run(), 5) is None


def test_the_rule_fires_after_the_turn_of_a_hacking_run():
    """It fires after the exploit begins (step 31), not before, and within three windows: by
    hand, the KL at steps 31 + i is 3 + 2 i, so the mean of the last five passes 20 when
    3 + 2 (i - 2) > 20, at i = 11, step 42."""
    step = first_warning(hacking_run(), 5)
    assert step == 42
    history = hacking_run()[:step]
    assert "kl_level" in fired(signals(history, 5))
    assert not warns(signals(history[:-1], 5))
    assert first_warning(hacking_run()[:30], 5) is None


def test_the_monitor_says_it_once_and_not_again_after_a_resume():
    history = hacking_run()
    monitor, messages, logged = HackingMonitor(5), [], []
    for r in history:
        figures, message = monitor.update({k: v for k, v in r.items() if k != "step"}, r["step"])
        logged.append({**r, **figures})
        messages += [message] if message else []
    assert len(messages) == 1 and "reward hacking" in messages[0]
    assert sum(r["hacking_warning"] for r in logged) > 1  # logged at every iteration it holds
    assert "signal_kl_accel" in logged[-1] and "signal_disagreement" not in logged[-1]
    # resumed while the warning holds: the next iteration's warning is logged, not said again
    on = [r["step"] for r in logged if r["hacking_warning"]]
    assert on[1] == on[0] + 1
    resumed = HackingMonitor(5, logged[:on[0]])
    figures, message = resumed.update({k: v for k, v in history[on[0]].items() if k != "step"}, on[1])
    assert figures["hacking_warning"] and message is None


class Count(torch.nn.Module):
    """A reward model scoring a sequence by how often token `tid` occurs, times `scale`."""

    def __init__(self, tid, scale):
        super().__init__()
        self.tid, self.scale = tid, scale

    def forward(self, seqs, mask, normalise=True):
        return self.scale * ((seqs == self.tid) & mask.bool()).sum(-1).float()


def test_the_held_out_gap_is_the_mean_difference_of_the_two_scores():
    """Training scores 2 x count, held-out 1 x count: the gap is the mean count, over every
    batch since `begin`; PPO gets the training scores unchanged."""
    seqs = torch.tensor([[3, 3, 4], [3, 4, 4], [4, 4, 4]])
    mask = torch.ones_like(seqs)

    def train_reward(s, m, action_mask):
        return Count(3, 2.0)(s, m)
    gap = HeldOutGap(train_reward, Count(3, 1.0), rows=2)
    gap.begin("iteration 1")
    torch.testing.assert_close(gap(seqs, mask, None), torch.tensor([4.0, 2.0, 0.0]))
    gap(seqs[:1], mask[:1], None)
    assert gap.figures() == {"heldout_gap": pytest.approx((2 + 1 + 0 + 2) / 4)}
    assert gap.clipped is True  # a reward model's scores stay clipped by the trainer
    gap.begin("iteration 2")
    assert gap.figures() == {}
