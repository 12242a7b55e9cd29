"""pass@k (mingpt_rlhf/lab/passk.py): the estimator by hand, against the binomials, against every
draw of k answers, unbiased for the true pass@k; the command on a tiny sort policy."""
import itertools
import json
import math

import pytest

from mingpt_rlhf.lab.passk import main, pass_at_k, pass_at_k_curve
from test_guards import random_policy


def test_by_hand():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)    # 1 - C(3,2) / C(5,2)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)          # pass@1 is c / n
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0                         # n - c < k: every draw holds one
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_equals_the_binomial_form_where_it_can_be_computed():
    # either product (c factors or k factors, whichever is shorter) at pass@k's sizes
    for n, c, k in itertools.product([1, 7, 30, 200, 1024], [0, 1, 3, 29, 700], [1, 2, 5, 30, 512]):
        if c <= n and k <= n:
            exact = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_is_the_share_of_k_draws_that_hold_a_right_answer():
    """Averaged over every set of k of the n answers, exactly."""
    answers = [True, False, True, False, False, True, False]   # n = 7, c = 3
    for k in range(1, 8):
        draws = list(itertools.combinations(answers, k))
        assert pass_at_k(7, 3, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_is_unbiased_for_the_true_pass_at_k():
    """Each answer right with probability p: over c ~ Binomial(n, p) its expectation is
    1 - (1 - p)^k, the chance that k fresh answers hold a right one."""
    n = 40
    for p, k in [(0.01, 1), (0.01, 16), (0.2, 5), (0.5, 40)]:
        expected = sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c) * pass_at_k(n, c, k)
                       for c in range(n + 1))
        assert expected == pytest.approx(1 - (1 - p) ** k, rel=1e-9)
    assert pass_at_k_curve([(4, 0), (4, 4)], [1, 2]) == {1: 0.5, 2: 0.5}


def test_the_command_on_a_tiny_policy(tmp_path, capsys):
    policy = random_policy(tmp_path / "sft", "sort")
    result = main([str(policy), "--task", "sort", "--n", "8", "--k", "1", "2", "8",
                   "--problems", "3", "--json", str(tmp_path / "p.json")])
    assert result["n"] == 8 and result["problems"] == 3 and len(result["right"]) == 3
    assert all(0 <= c <= 8 for c in result["right"])
    curve = [result["pass_at_k"][k] for k in ("1", "2", "8")]
    assert curve == sorted(curve)   # more tries never pass less often
    assert json.loads((tmp_path / "p.json").read_text()) == result
    assert "pass@1" in capsys.readouterr().out
    # the same seed draws the same answers
    again = main([str(policy), "--task", "sort", "--n", "8", "--k", "1", "--problems", "3"])
    assert again["right"] == result["right"]


@pytest.mark.parametrize("args, words", [
    (["--n", "4", "--k", "8"], "--k between 1 and --n"),
    (["--task", "reviews"], "no exact check"),
    (["--problems", "0"], "--problems must be >= 1"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, args, words):
    policy = random_policy(tmp_path / "sft", "sort")
    with pytest.raises(SystemExit) as e:
        main([str(policy), *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and words in err and len(err.splitlines()) == 1


def test_pi_star_raises_the_mass_of_every_set_of_the_best_answers():
    """pi* = ref x exp(r / beta) / Z gives every set {r >= t} at least the reference's mass,
    so in the enumerable world its pass@k is at or above the reference's at every k, for any
    number of right answers counted from the top (bench/passk_exact.py relies on it)."""
    from mingpt_rlhf.lab.tabular import make_world, optimal_policy, response_logprobs
    for seed in range(5):
        world = make_world(seed)
        ref = response_logprobs(world.ref).exp()
        star = response_logprobs(optimal_policy(world)).exp()
        order = world.reward.argsort(descending=True)
        assert (star[order].cumsum(0) >= ref[order].cumsum(0) - 1e-12).all()
        assert star[order[0]] > ref[order[0]]
