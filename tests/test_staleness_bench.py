"""bench/staleness.py: which corrections each algorithm runs at each lag, and the summary's
asynchronous-sampler model, on constructed runs."""
import pytest

from conftest import bench_module


def bench():
    return bench_module("staleness")


def test_the_grid_runs_each_correction_where_it_means_something():
    b = bench()
    assert b.corrections("ppo", 0) == b.corrections("grpo", 0) == ["none"]   # fp32: all the same
    assert b.corrections("online_dpo", 4) == ["none"]                         # no ratio to correct
    assert b.corrections("ppo", 2) == ["none", "clip", "decoupled", "tis", "mask"]
    assert b.corrections("grpo", 2) == b.corrections("ppo", 2) + ["gspo"]     # one ratio per response


def test_the_overlap_model_is_max_of_sampling_and_the_rest():
    """Lag 0, two seeds: sampling 3 s and 5 s (mean 4), scoring + learning 6 s and 8 s (mean
    7): synchronous 11 s an iteration, overlapped max(4, 7) = 7 s, 4/11 saved."""
    b = bench()
    run = lambda gen, score, learn, gold: {"t_generate": gen, "t_score": score, "t_learn": learn,
                                           "gold": gold, "kl": 3.0}
    result = {"runs": {"sort/grpo/lag0/none/0": run(3.0, 1.0, 5.0, 0.9),
                       "sort/grpo/lag0/none/1": run(5.0, 2.0, 6.0, 0.8),
                       "sort/grpo/lag4/tis/0": run(3.0, 1.0, 5.0, 0.7)}}
    b.summarise(result)
    model = result["async_model"]["rows"]["sort/grpo"]
    assert (model["synchronous_s"], model["overlapped_s"]) == (11.0, 7.0)
    assert model["saved"] == pytest.approx(4 / 11)
    assert result["summary"]["sort/grpo/lag0/none"]["gold"]["mean"] == pytest.approx(0.85)
    assert set(result["async_model"]["rows"]) == {"sort/grpo"}               # lag 0 runs only
    table = b.markdown_table(result)
    assert table.index("| 0 | none") < table.index("| 4 | tis")


def test_along_the_run_sees_a_fall_the_final_gold_hides():
    """Evals at steps 0, 20, 40, 60 with gold 0.1 (the start, left out), -0.6, 0.5, 0.9: the
    final gold is 0.9, the mean after the start (-0.6 + 0.5 + 0.9) / 3 = 0.2667, the low -0.6."""
    b = bench()
    run = {"gold": 0.9, "curve": [{"step": s, "gold": g} for s, g in
                                  ((0, 0.1), (20, -0.6), (40, 0.5), (60, 0.9))]}
    b.along_the_run(run)
    assert run["gold_along"] == pytest.approx(0.8 / 3)
    assert run["gold_low"] == pytest.approx(-0.6)
    result = {"runs": {"sort/ppo/lag8/tis/0": run}}
    b.summarise(result)
    assert result["summary"]["sort/ppo/lag8/tis"]["gold_low"]["mean"] == pytest.approx(-0.6)
    assert "| -0.600 [-0.600, -0.600] |" in b.markdown_table(result)


def test_the_picture_is_drawn_from_the_summary(tmp_path):
    pytest.importorskip("matplotlib")
    b = bench()
    curve = lambda *gold: [{"step": 20 * i, "gold": g} for i, g in enumerate(gold)]
    seconds = {"t_generate": 1.0, "t_score": 0.5, "t_learn": 1.0}
    result = {"runs": {"sort/grpo/lag0/none/0": {"gold": 0.9, "curve": curve(0.5, 0.7, 0.9), **seconds},
                       "sort/grpo/lag8/tis/0": {"gold": 0.8, "curve": curve(0.5, 0.6, 0.8)},
                       "sort/grpo/lag8/none/0": {"gold": 0.7, "curve": curve(0.5, 0.4, 0.7)}}}
    b.summarise(result)
    b.draw(result, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 10_000
    curves = [result["runs"][f"sort/grpo/lag8/{c}/0"]["curve"] for c in ("tis", "none")]
    assert (b.overopt.mean_curve(curves, "step"), b.overopt.mean_curve(curves, "gold")) == \
        ([0, 20, 40], [0.5, 0.5, 0.75])


def test_the_lag_table_puts_the_lags_side_by_side_from_the_lag0_run():
    """Lag 0 (one run, 0.9) starts every correction's row; tis at lag 4 (0.8, 0.6: mean 0.7)
    and lag 8 (0.5); clip only at lag 8 (0.4), its lag-4 cell empty."""
    b = bench()
    t = {"t_generate": 1.0, "t_score": 0.5, "t_learn": 1.0}
    result = {"runs": {"sort/ppo/lag0/none/0": {"gold": 0.9, **t},
                       "sort/ppo/lag4/tis/0": {"gold": 0.8}, "sort/ppo/lag4/tis/1": {"gold": 0.6},
                       "sort/ppo/lag8/tis/0": {"gold": 0.5}, "sort/ppo/lag8/clip/0": {"gold": 0.4}}}
    b.summarise(result)
    lines = b.lag_table(result, "sort").splitlines()
    assert lines[0] == "| algo | correction | lag 0 | lag 4 | lag 8 |"
    assert lines[2:] == ["| ppo | clip | 0.900 [0.90, 0.90] (1) |  | 0.400 [0.40, 0.40] (1) |",
                         "| ppo | tis | 0.900 [0.90, 0.90] (1) | 0.700 [0.60, 0.80] (2) | 0.500 [0.50, 0.50] (1) |"]


def test_the_change_is_taken_against_the_same_seeds_lag0_run():
    """Seed 0 starts at 0.9 and ends at 0.8 with a lag, seed 1 starts at 0.7 and ends at 0.7:
    changes -0.1 and 0 (mean -0.05), where the golds' own means differ by 0.05 only because the
    seeds do; a run whose seed has no lag-0 run gets no change."""
    b = bench()
    t = {"t_generate": 1.0, "t_score": 0.5, "t_learn": 1.0}
    result = {"runs": {"sort/ppo/lag0/none/0": {"gold": 0.9, **t}, "sort/ppo/lag0/none/1": {"gold": 0.7, **t},
                       "sort/ppo/lag8/tis/0": {"gold": 0.8}, "sort/ppo/lag8/tis/1": {"gold": 0.7},
                       "sort/ppo/lag8/tis/2": {"gold": 0.1}}}
    b.summarise(result)
    change = result["summary"]["sort/ppo/lag8/tis"]["gold_change"]
    assert (change["mean"], change["min"], change["max"]) == pytest.approx((-0.05, -0.1, 0.0))
    assert "gold_change" not in result["runs"]["sort/ppo/lag8/tis/2"]
    assert "| ppo | tis | +0.000 [+0.00, +0.00] (2) | -0.050 [-0.10, +0.00] (2) |" in \
        b.lag_table(result, "sort", "gold_change")
