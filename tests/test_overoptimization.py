"""Overoptimization's functional forms (mingpt_rlhf/lab/overoptimization.py) fitted on curves made
from known coefficients, best-of-n's KL formula against the exact KL of small policies, and
bench/overoptimization.py's curves, fits and tables on runs of known shape."""
import itertools
import math

import pytest
import torch

from conftest import bench_module
from mingpt_rlhf.methods.bestofn import best_of_n_kl, best_of_n_kl_exact, best_of_n_weights
from mingpt_rlhf.lab.overoptimization import curve, fit


@pytest.mark.parametrize("form,alpha,beta,peak", [
    ("bon", 0.8, 0.2, 0.8 / 0.4),
    ("rl", 0.6, 0.3, math.exp(0.6 / 0.3 - 1)),
])
def test_a_fit_recovers_known_coefficients(form, alpha, beta, peak):
    d = torch.linspace(0, 5, 21)
    exact = fit(form, d, curve(form, d, alpha, beta))
    assert exact["alpha"] == pytest.approx(alpha, abs=1e-9)
    assert exact["beta"] == pytest.approx(beta, abs=1e-9)
    assert exact["r2"] == pytest.approx(1.0) and exact["peak_d"] == pytest.approx(peak)
    # with noise the coefficients move a little and r2 drops below 1, not to nonsense
    g = torch.Generator().manual_seed(0)
    noisy = curve(form, d, alpha, beta) + 0.02 * torch.randn(21, generator=g, dtype=torch.float64)
    f = fit(form, d, noisy)
    assert abs(f["alpha"] - alpha) < 0.05 and abs(f["beta"] - beta) < 0.05 and 0.9 < f["r2"] < 1


def test_the_two_forms_tell_their_curves_apart():
    """A best-of-n curve is fitted better by the best-of-n form than the RL form, and the other
    way round."""
    d = torch.linspace(0.1, 4, 30)
    bon, rl = curve("bon", d, 1.0, 0.3), curve("rl", d, 0.5, 0.4)
    assert fit("bon", d, bon)["r2"] > fit("rl", d, bon)["r2"]
    assert fit("rl", d, rl)["r2"] > fit("bon", d, rl)["r2"]


def test_a_curve_that_never_turns_down_has_no_peak():
    d = torch.linspace(0, 3, 10)
    assert fit("bon", d, 0.5 * d)["peak_d"] == math.inf


def test_an_exactly_linear_curve_has_no_peak_in_reach_for_either_form():
    """A gold that still rises linearly: the fitted beta is 0 up to rounding, of either sign.
    A tiny positive one puts the RL form's peak at exp(alpha / beta - 1), beyond any float:
    that is no peak (inf), not an OverflowError."""
    g = torch.Generator().manual_seed(0)
    curves = [(torch.linspace(0, 3, 10), 0.5), (torch.tensor([0.5, 1.0, 2.0]), 0.1)]
    curves += [(3 * torch.rand(6, generator=g, dtype=torch.float64), 0.1 + torch.rand(1, generator=g).item())
               for _ in range(50)]
    for d, slope in curves:
        assert fit("rl", d, slope * d)["peak_d"] == math.inf
        assert fit("bon", d, slope * d)["peak_d"] > 1e6 * d.max()


def test_a_best_of_n_curve_that_only_falls_peaks_at_zero():
    """alpha < 0 < beta: the fitted gold d (alpha - beta d) falls from d = 0, so its highest
    point is d = 0 (gold 0), not the negative root of its derivative."""
    f = fit("bon", [0.5, 1, 2], [-0.1, -0.3, -0.9])
    assert f["alpha"] < 0 < f["beta"]
    assert f["peak_d"] == 0.0 and float(curve("bon", [f["peak_d"]], f["alpha"], f["beta"])) == 0.0


def test_bad_fit_input_is_refused():
    with pytest.raises(ValueError, match="same length"):
        fit("bon", [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="negative"):
        fit("rl", [-1, 2], [0, 1])
    with pytest.raises(ValueError, match="form"):
        fit("ppo", [1, 2], [0, 1])


def test_best_of_n_kl_formula_is_the_exact_kl_without_ties_and_bounds_it_with_ties():
    """A policy over 2000 equally likely outcomes with distinct rewards: best-of-n's exact KL
    approaches log n - (n - 1)/n (the formula holds for continuous rewards; 2000 outcomes make
    ties between samples rare). With ties (4 levels) the exact KL is below it."""
    distinct = torch.full((2000,), 1 / 2000)
    rewards = torch.randperm(2000, generator=torch.Generator().manual_seed(0)).float()
    for n in (1, 2, 4, 16, 64):
        assert best_of_n_kl_exact(distinct, rewards, n) == pytest.approx(best_of_n_kl(n), rel=1e-3)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    tied = torch.tensor([0.0, 1.0, 1.0, 2.0])  # 3 levels
    for n in (2, 8, 256):
        assert best_of_n_kl_exact(probs, tied, n) < best_of_n_kl(n)
    # by hand, n = 2, two levels of 1/2: q = (1/4, 3/4), KL = 1/4 log(1/2) + 3/4 log(3/2)
    half = torch.tensor([0.5, 0.5])
    assert best_of_n_kl_exact(half, torch.tensor([0.0, 1.0]), 2) == pytest.approx(
        0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    assert best_of_n_kl(1) == 0 and best_of_n_kl_exact(half, torch.tensor([0.0, 1.0]), 1) == 0


def test_best_of_n_weights_give_the_mean_over_every_subset():
    """Six scores: the weighted sum equals the mean, over all C(6, n) subsets of n, of the
    subset's highest score."""
    scores = torch.tensor([0.3, -1.0, 2.0, 0.7, 1.1, -0.2], dtype=torch.float64)
    ordered = scores.sort().values
    for n in range(1, 7):
        brute = [max(c) for c in itertools.combinations(scores.tolist(), n)]
        w = best_of_n_weights(6, n)
        assert w.sum().item() == pytest.approx(1.0)
        assert (ordered @ w).item() == pytest.approx(sum(brute) / len(brute))
    assert best_of_n_weights(256, 256)[-1].item() == 1.0
    with pytest.raises(ValueError):
        best_of_n_weights(4, 5)


def _bench():
    return bench_module("overoptimization"), bench_module("results_file")


def test_the_bench_fits_the_mean_over_seeds_and_the_dense_curves(tmp_path):
    """Two seeds' RL curves, one of them with its every-iteration curve, in two results files
    (two processes): merged, the eval curve is fitted on the point-by-point mean of both seeds
    and the dense fit on the one seed that logged it; both recover the coefficients."""
    bench, results_file = _bench()
    def points(d, alpha, beta, shift=0.0):
        return [{"d": x, "gold": g + shift} for x, g in zip(d, curve("rl", d, alpha, beta).tolist())]
    evals = [0.0, 1.0, 1.5, 2.0, 3.0]
    dense = [0.05 * i for i in range(1, 61)]
    one, two = str(tmp_path / "one.json"), str(tmp_path / "two.json")
    results_file.save(one, {"runs": {"rl/m/ppo_kl0/0": {"curve": points(evals, 0.6, 0.3, 0.01)}}})
    results_file.save(two, {"runs": {"rl/m/ppo_kl0/1": {"curve": points(evals, 0.6, 0.3, -0.01),
                                                         "train_curve": points(dense, 0.5, 0.2)}}})
    result = results_file.merge(one, [two])
    assert sorted(result["runs"]) == ["rl/m/ppo_kl0/0", "rl/m/ppo_kl0/1"]
    bench.fits(result)
    f = result["fits"]["rl/m/ppo_kl0"]
    assert f["seeds"] == 2 and f["rl"]["alpha"] == pytest.approx(0.6) and f["rl"]["beta"] == pytest.approx(0.3)
    assert f["dense"]["seeds"] == 1 and len(f["dense"]["d"]) == 60
    assert f["dense"]["rl"]["alpha"] == pytest.approx(0.5) and f["dense"]["rl"]["beta"] == pytest.approx(0.2)
    row = bench.dense_table(result).splitlines()[2]  # point 1 (d 0.10) is after one update
    assert row == "| rl/m/ppo_kl0 | 1 | 0.10, 0.10 / 0.30, 0.22 / 1.05, 0.51 | 0.500 | 0.200 | 1.000 | 4.48 |"
    # gold at equal d: the dense points after the first, binned (0.10-0.45 in d 0-0.5: 8 points)
    frontier = [r for r in bench.frontier_table(result).splitlines() if "ppo KL 0 |" in r]
    first_bin = [float(curve("rl", [x], 0.5, 0.2)) for x in dense[1:] if x < 0.5]
    assert len(frontier) == 1 and frontier[0].split(" | ")[2] == f"{sum(first_bin) / len(first_bin):.2f}"


def test_an_rl_runs_final_summary_is_not_an_iteration():
    """metrics.jsonl of an RL run: evals, training iterations, then the final summary, which
    repeats the last eval without a split and must not join the every-iteration curve."""
    bench, _ = _bench()
    def row(step, kl, gold, **extra):
        return {"step": step, "kl": kl, "gold": gold, "rm_score": 2 * gold, **extra}
    rows = [row(0, 0.0, -0.1, split="eval"), row(1, 0.01, -0.05), row(2, 1.0, 0.3),
            row(2, 1.21, 0.4, split="eval"), row(2, 1.21, 0.4, final=True)]
    evals, trains = bench.curves_of(rows)
    assert [p["step"] for p in evals] == [0, 2] and [p["step"] for p in trains] == [1, 2]
    assert trains[1] == {"step": 2, "d": 1.0, "kl": 1.0, "gold": pytest.approx(0.4), "proxy": pytest.approx(0.8)}
    assert evals[1]["d"] == pytest.approx(1.1) and evals[0]["gold"] == 0.0
