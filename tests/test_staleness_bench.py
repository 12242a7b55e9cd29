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
