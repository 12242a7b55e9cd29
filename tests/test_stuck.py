"""A run that stopped learning says so (machinery/watch.py): `stuck` counts the iterations in a
row without a learning signal while the reward is below the run's best, one line is printed
when it reaches STUCK_AFTER, and a run at its best (every episode won) is never called stuck."""
from types import SimpleNamespace

from mingpt_rlhf.machinery.watch import STUCK_AFTER, RunWatch


def cfg():
    return SimpleNamespace(warning_window=5, target_kl=0.02, env="duel", penalize_missing_eos=True,
                           max_new_tokens=3, missing_eos_penalty=-1.0, kl_target=3.0,
                           max_iters=300, adaptive_kl=True, algo="grpo", dpo_beta=0.3)


def it(score, zero_groups=0.2, entropy=0.5):
    return {"score": score, "zero_groups": zero_groups, "entropy": entropy, "kl": 0.1,
            "minibatch_steps": 16, "early_stop_kl": 0.0, "eos_rate": 1.0, "reward": score}


def watched(iterations, capsys=None):
    watch, stuck = RunWatch(cfg()), []
    for step, stats in enumerate(iterations, 1):
        stuck.append(watch.check(stats, step, 0.05)["stuck"])
    return watch, stuck


LEARNING = [it(0.5), it(0.6), it(0.75), it(0.7)]


def test_a_collapsed_run_is_stuck_and_says_so_once(capsys):
    """Every group tied at 0 (the duel game's empty answer): counted from the first such
    iteration, one line at STUCK_AFTER, none before or after."""
    _, stuck = watched(LEARNING + [it(0.0, zero_groups=1.0, entropy=0.0)] * (STUCK_AFTER + 5))
    assert stuck == [0] * 4 + list(range(1, STUCK_AFTER + 6))
    out = capsys.readouterr().out
    assert out.count("warning: the run is stuck") == 1
    assert f"for {STUCK_AFTER} iterations up to {4 + STUCK_AFTER}" in out
    assert "every group's rewards tied" in out and "below its best (0.750)" in out


def test_a_run_that_writes_one_answer_is_stuck_without_groups(capsys):
    """PPO has no groups: an entropy under 0.01 nats with the reward below its best counts."""
    _, stuck = watched(LEARNING + [it(0.3, zero_groups=0.0, entropy=0.003)] * STUCK_AFTER)
    assert stuck[-1] == STUCK_AFTER
    assert "writes one answer (entropy 0.003 nats)" in capsys.readouterr().out


def test_a_run_at_its_best_is_done_not_stuck(capsys):
    """Every episode won, every group tied at 1, entropy 0: no signal, and nothing to learn.
    Near the best (within a tenth of the range seen) is not stuck either."""
    _, stuck = watched(LEARNING + [it(1.0, zero_groups=1.0, entropy=0.001)] * (2 * STUCK_AFTER))
    assert stuck == [0] * (4 + 2 * STUCK_AFTER)
    _, stuck = watched([it(0.2), it(1.0)] + [it(0.95, zero_groups=1.0, entropy=0.002)] * 20)
    assert max(stuck) == 0 and "stuck" not in capsys.readouterr().out


def test_a_signal_resets_the_count():
    _, stuck = watched(LEARNING + [it(0.1, zero_groups=1.0)] * 3 + [it(0.1)] + [it(0.1, 1.0)] * 2)
    assert stuck[4:] == [1, 2, 3, 0, 1, 2]


def test_a_resumed_watch_counts_on_from_the_logged_lines():
    """--resume: the count, the best and the worst come back from the logged iterations."""
    iterations = LEARNING + [it(0.0, zero_groups=1.0)] * 6
    whole, stuck = watched(iterations + [it(0.0, zero_groups=1.0)])
    resumed = RunWatch(cfg())
    resumed.resume(iterations)
    assert resumed.check(it(0.0, zero_groups=1.0), len(iterations) + 1, 0.05)["stuck"] == stuck[-1] == 7
    assert (resumed.best, resumed.worst) == (whole.best, whole.worst) == (0.75, 0.0)
