"""bench/warning_score.py: a stored run's signals replayed as the trainer computed them, the
damage step, a rule's figures counted by hand, and thresholds fitted on some seeds and scored
on others."""
import random

import pytest

from conftest import bench_module
from mingpt_rlhf.lab.hacking import HackingMonitor


def ws():
    return bench_module("warning_score")


def stored_run(gold, kl, length=None, entropy=None, ens_std=None, heldout_gap=None):
    """A run as bench/reward_hacking.py stores it, its warning logged by the library's monitor."""
    n = len(gold)
    raw = {"kl": kl, "resp_len": length or [6.0] * n, "entropy": entropy or [1.5] * n,
           "ens_std": ens_std or [None] * n, "heldout_gap": heldout_gap or [None] * n}
    monitor, warned = HackingMonitor(window=5), []
    for t in range(n):
        figures, _ = monitor.update({k: v[t] for k, v in raw.items() if v[t] is not None}, step=t + 1)
        warned.append(figures["hacking_warning"])
    return {"iterations": {"step": list(range(1, n + 1)), "gold": gold, "rm_score": [0.0] * n,
                           **raw, "hacking_warning": warned}}


def test_the_replay_is_the_trainers_warning_iteration_by_iteration():
    rng = random.Random(0)
    walk = lambda start, step: [start + step * t + rng.gauss(0, abs(step) * 3 + 0.01) for t in range(80)]  # noqa: E731
    for _ in range(5):
        run = stored_run([0.0] * 80, kl=walk(0.5, 0.1 * rng.random()), length=walk(6, 0.03 * rng.random()),
                         entropy=walk(1.6, -0.01 * rng.random()), ens_std=walk(0.1, 0.002),
                         heldout_gap=walk(0.0, 0.01))
        s = ws().series(run)
        assert s["rule"] == run["iterations"]["hacking_warning"]
        assert any(s["rule"]) or not any(run["iterations"]["hacking_warning"])
        kl = run["iterations"]["kl"]
        assert s["kl_level"][:14] == [None] * 14 and s["kl_level"][14] == pytest.approx(sum(kl[10:15]) / 5)
        assert s["kl_jump"][30] == pytest.approx(sum(kl[26:31]) / sum(kl[21:26]) - 1)


def test_the_damage_starts_where_the_moving_mean_is_drop_below_its_peak():
    """Gold up by 0.1 an iteration to 1.0 at step 10, then down by 0.1: the trailing mean of 5
    peaks at 0.88 (step 12); at step 14 it is (1.0+0.9+0.8+0.7+0.6)/5 = 0.8 (not below 0.78),
    at step 15 (0.9+...+0.5)/5 = 0.7: the damage starts at step 15."""
    gold = [0.1 * t for t in range(1, 11)] + [1.0 - 0.1 * t for t in range(1, 11)]
    assert ws().damage_step({"step": list(range(1, 21)), "gold": gold}) == 15
    assert ws().damage_step({"step": list(range(1, 21)), "gold": [0.5] * 20}) is None


def test_a_signal_fires_in_its_own_direction():
    s = {"step": [1, 2, 3], "kl_level": [None, 1.0, 3.0], "entropy_trend": [-0.001, -0.02, -0.05],
         "length_drift": [0.1, -0.3, 0.5]}
    assert ws().first_fire(s, "kl_level", 2.0) == 3
    assert ws().first_fire(s, "entropy_trend", -0.01) == 2      # falling below
    assert ws().first_fire(s, "length_drift", 0.25) == 2        # either way
    assert ws().first_fire(s, "kl_level", 5.0) is None


def test_a_rules_figures_counted_by_hand():
    over = {"overoptimized": True, "peak_step": 30, "damage_step": 40}
    calm = {"overoptimized": False, "peak_step": 90, "damage_step": None}
    j = ws().judge([(over, 20), (over, 35), (over, 50), (over, None), (calm, 10), (calm, None)])
    # fired at 20: before the peak (lead 10) and the damage; at 35: before the damage only
    assert j == {"overoptimized": 4, "calm": 2, "before_peak": 1, "before_damage": 2, "caught": 3,
                 "median_lead": 10, "false_alarms": 1}


def hump_run(jump_at, kl_after):
    """Gold rising to step 30 then falling by 0.02 an iteration; the KL steady at 2 nats until
    `jump_at`."""
    gold = [0.02 * t for t in range(30)] + [0.6 - 0.02 * t for t in range(30)]
    kl = [2.0 if t < jump_at else kl_after for t in range(60)]
    return stored_run(gold, kl)


def test_a_threshold_fitted_on_some_seeds_is_scored_on_the_others():
    """Runs that overoptimize have their KL jump to 9 after the gold's peak (step 33) and before
    the damage (step 40); calm runs
    stay at 2 or reach 4 without harm: the fitted KL budget lies between 4 and 9 and, on the
    held-out seed's runs of the same kind, warns every overoptimizing run and no calm one."""
    calm_gold = [0.02 * t for t in range(60)]
    calm = lambda kl_after: stored_run(calm_gold, [2.0] * 30 + [kl_after] * 30)  # noqa: E731
    runs = {}
    for seed in (0, 1, 2):
        runs[f"ppo/noise0.25/single_kl0/{seed}"] = hump_run(jump_at=28 + seed, kl_after=9.0)
        runs[f"ppo/noise0/single_kl0/{seed}"] = calm(4.0)
        runs[f"ppo/noise0/mean_kl0/{seed}"] = calm(2.0)
    out = ws().calibrate({"runs": runs}, fit_seeds={0, 1}, test_seeds={2})
    c = out["kl_level"]
    assert 4.0 <= c["threshold"] < 9.0
    assert c["fit"]["before_damage"] == 2 and c["fit"]["false_alarms"] == 0
    assert c["test"] == {"overoptimized": 1, "calm": 2, "before_peak": 0, "before_damage": 1,
                         "caught": 1, "median_lead": None, "false_alarms": 0}
    assert "kl_level" in ws().calibration_table(out)


def test_a_rule_of_two_signals_fires_where_both_have_passed():
    s = {"step": [1, 2, 3, 4], "kl_level": [1.0, 5.0, 5.0, 5.0], "length_drift": [0.0, 0.0, -0.5, 0.0]}
    assert ws().first_fire_rule(s, {"kl_level": 4.0, "length_drift": 0.25}, 1) == 2
    assert ws().first_fire_rule(s, {"kl_level": 4.0, "length_drift": 0.25}, 2) == 3
    assert ws().first_fire_rule(s, {"kl_level": 6.0, "length_drift": 0.25}, 2) is None
