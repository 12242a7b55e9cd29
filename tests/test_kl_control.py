"""The adaptive KL controller on simulated runs, where the KL as a function of beta is known.

Plant: KL(beta) = C / beta (a decreasing function: a larger penalty, a closer policy), so the
beta that meets the target is C / target. Measured KL gets +-10 % uniform noise.
"""
import math
import random

import pytest

from mingpt_rlhf.ppo import AdaptiveKLController, FixedKLController

TARGET, C = 6.0, 0.3
BETA_STAR = C / TARGET  # 0.05


def simulate(beta0, steps=300, noise=0.1, seed=0, controller=AdaptiveKLController, **kw):
    """[(beta, noise-free KL)] before each update, the controller fed noisy measurements."""
    ctl = controller(beta0, TARGET, kw.pop("horizon", 10.0))
    rnd = random.Random(seed)
    trace = []
    for _ in range(steps):
        kl = C / ctl.value
        trace.append((ctl.value, kl))
        ctl.update(kl * (1 + noise * (2 * rnd.random() - 1)))
    return trace


def last_update_outside(trace, band=0.1):
    out = [t for t, (_, kl) in enumerate(trace) if abs(kl / TARGET - 1) > band]
    return max(out) + 1 if out else 0


@pytest.mark.parametrize("seed", range(5))
def test_converges_within_10_percent_from_a_beta_10x_too_small(seed):
    """KL 10x the target: beta rises at ~10 % per update (horizon 10), in band from update 60."""
    trace = simulate(BETA_STAR / 10, seed=seed)
    assert last_update_outside(trace) <= 60
    assert last_update_outside(trace) >= 23  # it cannot be faster than e^(1/10) per update


@pytest.mark.parametrize("seed", range(5))
def test_converges_within_10_percent_from_a_beta_10x_too_large(seed):
    """KL a tenth of the target: beta falls at ~2 % per update, in band from update 140."""
    trace = simulate(BETA_STAR * 10, seed=seed)
    assert last_update_outside(trace) <= 140
    assert last_update_outside(trace) >= 100  # ln(10) / 0.02 = 115 updates at the clip


@pytest.mark.parametrize("beta0", [BETA_STAR / 10, BETA_STAR * 10])
def test_approaches_monotonically_without_overshoot_when_noise_free(beta0):
    kls = [kl for _, kl in simulate(beta0, noise=0.0)]
    steps = [b - a for a, b in zip(kls, kls[1:])]
    if beta0 < BETA_STAR:  # KL falls towards the target and never below it
        assert all(s <= 1e-12 for s in steps) and min(kls) >= TARGET * (1 - 1e-9)
    else:
        assert all(s >= -1e-12 for s in steps) and max(kls) <= TARGET * (1 + 1e-9)
    assert kls[-1] == pytest.approx(TARGET, rel=1e-3)


def test_rises_fast_and_falls_slowly_per_update():
    up = AdaptiveKLController(0.1, TARGET, 10.0)
    up.update(1000 * TARGET)  # error clipped to +1
    assert up.value == pytest.approx(0.1 * math.exp(0.1))
    down = AdaptiveKLController(0.1, TARGET, 10.0)
    down.update(0.0)  # error clipped to -0.2 (and a KL of 0 is no error)
    assert down.value == pytest.approx(0.1 * math.exp(-0.02))
    inside = AdaptiveKLController(0.1, TARGET, 4.0)
    inside.update(TARGET * 1.1)  # within the clip: log(1.1) / 4
    assert inside.value == pytest.approx(0.1 * 1.1 ** 0.25)


def lagged_run(up, down, lag=0.05, steps=300):
    """The policy starts at the SFT model (KL 0) and drifts a fraction `lag` of the way to
    KL(beta) each update, as a real policy does; the peak KL over the target."""
    old = AdaptiveKLController.UP, AdaptiveKLController.DOWN
    AdaptiveKLController.UP, AdaptiveKLController.DOWN = up, down
    try:
        ctl, drift, peak = AdaptiveKLController(BETA_STAR, TARGET, 10.0), 0.0, 0.0
        for _ in range(steps):
            drift += lag * (C / ctl.value - drift)
            peak = max(peak, drift / TARGET)
            ctl.update(drift)
    finally:
        AdaptiveKLController.UP, AdaptiveKLController.DOWN = old
    return peak, drift / TARGET


def test_slow_fall_limits_the_overshoot_of_a_lagging_policy():
    """While the policy has not drifted yet the KL reads low and a symmetric controller keeps
    cutting beta (windup); the policy then overshoots. The asymmetric clip limits that."""
    peak, end = lagged_run(AdaptiveKLController.UP, AdaptiveKLController.DOWN)
    sym_peak, sym_end = lagged_run(1.0, -1.0)
    assert peak < 1.3 and sym_peak > 1.5
    assert end == pytest.approx(1.0, abs=0.02) and sym_end == pytest.approx(1.0, abs=0.02)


def test_state_round_trip_continues_exactly():
    a = AdaptiveKLController(0.05, TARGET, 10.0)
    for kl in [9.0, 3.0, 7.5]:
        a.update(kl)
    b = AdaptiveKLController(0.05, TARGET, 10.0)
    b.load_state_dict(a.state_dict())
    for kl in [12.0, 1.0]:
        a.update(kl)
        b.update(kl)
    assert a.value == b.value
    fixed = FixedKLController(0.2)
    fixed.update(100.0)
    assert fixed.value == 0.2 and fixed.state_dict() == {"value": 0.2}


def test_refuses_a_beta_it_could_never_move():
    with pytest.raises(ValueError):
        AdaptiveKLController(0.0, TARGET, 10.0)


def test_refuses_the_unresolved_auto_coefficient():
    """train_ppo.Config's kl_coef is -1 (auto) until the config is resolved; a controller built
    from it would turn the KL penalty into a bonus."""
    with pytest.raises(ValueError, match="resolve"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError):
        AdaptiveKLController(-1.0, TARGET, 10.0)


def test_a_run_held_far_above_target_then_released_can_learn_again():
    """A collapsed run: KL 45 nats per response (target 3) for 180 iterations whatever beta
    does, then the policy comes back and obeys the plant KL = C / beta again (C such that the
    starting beta 0.2 meets the target). Beta never passes 10x its start, and is back within 2x
    of it within 81 iterations of the release (ln 5 / 0.02); unbounded it would have wound up
    to 0.2 e^18 = 1.3e7 and needed ~860."""
    start, target = 0.2, 3.0
    ctl = AdaptiveKLController(start, target, 10.0)
    for _ in range(180):
        ctl.update(45.0)
        assert ctl.value <= 10 * start * (1 + 1e-12)
    assert ctl.value == ctl.high == pytest.approx(10 * start)
    c = start * target
    for released in range(1, 200):
        ctl.update(c / ctl.value)
        if ctl.value <= 2 * start:
            break
    assert released <= 81 and ctl.value < ctl.high, released
    assert math.log(start * math.exp(18) / (2 * start)) / 0.02 > 800  # the unbounded return


def test_beta_stays_above_a_tenth_of_its_start_and_the_bound_survives_a_resume():
    """A policy that never moves (KL 0) lowers beta 2 % an iteration: bounded at kl_coef / 10,
    so a later drift meets a penalty again at once. A checkpoint holding a wound-up beta (saved
    before the bound) loads at the bound."""
    ctl = AdaptiveKLController(0.05, 3.0, 10.0)
    for _ in range(1000):
        ctl.update(0.0)
    assert ctl.value == ctl.low == pytest.approx(0.005)
    fresh = AdaptiveKLController(0.05, 3.0, 10.0)
    fresh.load_state_dict({"value": 3.6e7})
    assert fresh.value == fresh.high == pytest.approx(0.5)
    assert FixedKLController(0.05).high == math.inf  # nothing to reach
