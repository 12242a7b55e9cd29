"""bench/reward_hacking.py: the warning's scoring on constructed runs, and the study's code path
at tiny size (--smoke), resumable."""
import json

import pytest

from conftest import bench_module


def bench():
    return bench_module("reward_hacking")


def run_of(gold, warned_at=None):
    steps = list(range(1, len(gold) + 1))
    return {"iterations": {"step": steps, "gold": gold,
                           "hacking_warning": [s == warned_at or (warned_at is not None and s > warned_at)
                                               for s in steps]}}


def test_the_gold_peak_is_the_moving_means_and_a_drop_is_overoptimization():
    """Gold rising by 0.1 an iteration to step 10, then falling by 0.1: the trailing mean over
    5 iterations peaks at step 12 (0.9, 1.0, 0.9, 0.8, ... at 8-12: (0.8+0.9+1.0+0.9+0.8)/5 =
    0.88) and ends at the mean of the last five."""
    b = bench()
    gold = [0.1 * t for t in range(1, 11)] + [1.0 - 0.1 * t for t in range(1, 11)]
    step, peak, last = b.gold_peak(run_of(gold)["iterations"])
    assert step == 12 and peak == pytest.approx(0.88) and last == pytest.approx((0.4 + 0.3 + 0.2 + 0.1 + 0.0) / 5)
    score = b.warning_score(run_of(gold, warned_at=9))
    assert score["overoptimized"] and score["warned_at"] == 9 and score["lead"] == 3
    flat = b.warning_score(run_of([0.5] * 20))
    assert not flat["overoptimized"] and flat["warned_at"] is None and flat["lead"] is None


def test_the_warning_summary_counts_leads_false_alarms_and_precision():
    b = bench()
    hump = [0.1 * t for t in range(1, 11)] + [1.0 - 0.1 * t for t in range(1, 11)]  # peak at 12
    result = {"runs": {"ppo/noise0/single_kl0/0": run_of(hump, warned_at=9),    # in time, lead 3
                       "ppo/noise0/single_kl0/1": run_of(hump, warned_at=15),   # too late
                       "ppo/noise0/wco_kl0/0": run_of(hump),                    # missed
                       "ppo/noise0/wco_kl0.02/0": run_of([0.5] * 20, warned_at=4),  # false alarm
                       "ppo/noise0/wco_kl0.02/1": run_of([0.5] * 20),
                       "bon/noise0/single/0": {"curve": []}}}                  # not a PPO run
    summary = b.warning_summary(result)
    assert summary["runs"] == 5 and summary["overoptimized"] == 3
    assert summary["warned_before_peak"] == pytest.approx(1 / 3) and summary["leads"] == [3]
    assert summary["false_alarms"] == pytest.approx(1 / 2)
    assert summary["precision"] == pytest.approx(2 / 3)


def test_the_length_only_reward_counts_words_without_eos():
    assert bench().length_reward(["p", "p"], ["dull . <eos>", "very dull and the plot was bland"]) == [0.2, 0.7]


def test_the_smoke_study_runs_every_part_and_resumes_without_redoing(tmp_path, monkeypatch):
    """--smoke on one noise level, three rewards and one KL coefficient: every part writes its
    runs; run again, nothing is trained (the runs are in the JSON)."""
    b = bench()
    results = tmp_path / "rh.json"
    argv = ["--smoke", "--work", str(tmp_path / "work"), "--results", str(results),
            "--noise", "0.25", "--rules", "single", "wco", "warm", "--kl_coefs", "0.02", "--threads", "1"]
    result = b.main(argv)
    saved = json.loads(results.read_text())
    expected = {f"bon/noise0.25/{r}/0" for r in ("single", "wco", "warm")} | \
        {f"ppo/noise0.25/{r}_kl0.02/0" for r in ("single", "wco", "warm")} | \
        {"length/bias0.5_kl0.02/0", "length/length_only_kl0.02/0", "rm/noise0.25/0"}
    assert set(saved["runs"]) == expected == set(result["runs"])
    members = saved["runs"]["rm/noise0.25/0"]
    assert set(members["figures"]) == {"member0", "member1", "warm"}
    assert members["trunk_distance"] > 0 and members["head_distance"] > 0  # both trained apart
    assert len(saved["runs"]["bon/noise0.25/wco/0"]["curve"]) == 4          # n = 1, 2, 4, 8
    ppo = saved["runs"]["ppo/noise0.25/wco_kl0.02/0"]
    assert len(ppo["iterations"]["step"]) == 4 and all(s is not None for s in ppo["iterations"]["ens_std"])
    assert all(g is not None for g in ppo["iterations"]["heldout_gap"])
    assert "within_bucket_gain" in saved["runs"]["length/bias0.5_kl0.02/0"]
    assert saved["warning"]["runs"] == 5

    def trained(*args, **kwargs):
        raise AssertionError("a finished run was trained again")
    for script in ("train_ppo", "train_rm", "train_sft"):
        monkeypatch.setattr(getattr(b, script), "main", trained)
    again = b.main(argv)
    assert again["runs"] == result["runs"]
