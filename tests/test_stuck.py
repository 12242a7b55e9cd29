"""A run that stopped learning says so (run/watch.py): `stuck` counts the iterations in a
row without a reward signal while the reward is below the SFT policy's level (the mean of the
first iterations), or, in a run whose every group has tied since its first iteration, below the
most an episode can return; one line is printed when it reaches STUCK_AFTER. A run that
converged at or above its SFT level is never called stuck, however its batch reward wanders."""
import json
import random
from pathlib import Path
from types import SimpleNamespace

from mingpt_rlhf.run.watch import SFT_ITERATIONS, STUCK_AFTER, RunWatch
from mingpt_rlhf.methods.env_guess import GuessNumber
from mingpt_rlhf.ppo import AdaptiveKLController, FixedKLController

BETA = FixedKLController(0.05)


def cfg():
    return SimpleNamespace(warning_window=5, target_kl=0.02, env="duel", penalize_missing_eos=True,
                           max_new_tokens=3, missing_eos_penalty=-1.0, kl_target=3.0,
                           max_iters=300, adaptive_kl=True, algo="grpo", dpo_beta=0.3)


def it(score, zero_groups=0.2, entropy=0.5, kl=0.1):
    return {"score": score, "zero_groups": zero_groups, "entropy": entropy, "kl": kl,
            "minibatch_steps": 16, "early_stop_kl": 0.0, "eos_rate": 1.0, "reward": score}


def watched(iterations, best=None, kl_ctl=BETA):
    watch, stuck = RunWatch(cfg(), best), []
    for step, stats in enumerate(iterations, 1):
        stuck.append(watch.check(stats, step, kl_ctl)["stuck"])
    return watch, stuck


LEARNING = [it(0.5), it(0.6), it(0.75), it(0.7)]  # SFT level: the first 3, 0.617


def test_a_collapsed_run_is_stuck_and_says_so_once(capsys):
    """Every group tied at 0 (the duel game's empty answer): counted from the first such
    iteration, one line at STUCK_AFTER, none before or after."""
    _, stuck = watched(LEARNING + [it(0.0, zero_groups=1.0, entropy=0.0)] * (STUCK_AFTER + 5))
    assert stuck == [0] * 4 + list(range(1, STUCK_AFTER + 6))
    out = capsys.readouterr().out
    assert out.count("warning: the run is stuck") == 1
    assert f"for {STUCK_AFTER} iterations up to {4 + STUCK_AFTER}" in out
    assert "every group's rewards tied" in out and "below its SFT policy's (0.617)" in out
    assert "no reward signal" in out


def test_a_run_that_writes_one_answer_is_stuck_without_groups(capsys):
    """PPO has no groups: an entropy under 0.01 nats with the reward below its SFT level counts."""
    _, stuck = watched(LEARNING + [it(0.3, zero_groups=0.0, entropy=0.003)] * STUCK_AFTER)
    assert stuck[-1] == STUCK_AFTER
    assert "writes one answer (entropy 0.003 nats)" in capsys.readouterr().out


def test_a_run_converged_above_its_sft_level_is_done_not_stuck(capsys):
    """Every episode won, every group tied at 1, entropy 0: no signal, and nothing to learn. A
    run tied below its best reward but above its SFT level is not stuck either."""
    _, stuck = watched(LEARNING + [it(1.0, zero_groups=1.0, entropy=0.001)] * (2 * STUCK_AFTER))
    assert stuck == [0] * (4 + 2 * STUCK_AFTER)
    _, stuck = watched(LEARNING + [it(0.9), it(1.0)] + [it(0.8, zero_groups=1.0, entropy=0.002)] * 20)
    assert max(stuck) == 0 and "stuck" not in capsys.readouterr().out


def guess_returns(policy: str, secrets: list[int]) -> list[float]:
    """Each secret's return under a deterministic guessing strategy: `binary` (halve the range)
    or `first` (1, 2, 3, ... : wins only the low secrets within 6 guesses)."""
    out = []
    for secret in secrets:
        low, high, wrong = 1, GuessNumber.N, 0
        for _ in range(GuessNumber.TURNS):
            guess = (low + high) // 2 if policy == "binary" else low
            if guess == secret:
                out.append(1.0 - GuessNumber.COST * wrong)
                break
            wrong += 1
            low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
        else:
            out.append(-GuessNumber.COST * wrong)
    return out


def best_so_far_rule(iterations) -> int:
    """The longest stretch the watch counted before it judged by the SFT level: no signal while
    the reward was below the best batch so far by more than a tenth of the range seen."""
    best = worst = None
    stuck = longest = 0
    for stats in iterations:
        score = stats["score"]
        best = score if best is None else max(best, score)
        worst = score if worst is None else min(worst, score)
        silent = stats["zero_groups"] >= 1.0 or stats["entropy"] < 0.01
        stuck = stuck + 1 if silent and best - score > 0.1 * (best - worst) else 0
        longest = max(longest, stuck)
    return longest


def test_a_converged_guessing_game_policy_is_never_flagged():
    """A converged guessing-game policy plays one strategy (entropy 0, every group of 8 tied:
    each group's 8 episodes share a secret), so its batch reward varies only with the 8 secrets
    drawn. Compared with the best batch so far, 26 of these 100 simulated runs of 300
    iterations were flagged; compared with the SFT level (a weaker policy: wins only the low
    secrets, its first iterations' batches), none is."""
    flagged = {"sft level": 0, "best so far": 0}
    for seed in range(100):
        rng = random.Random(seed)
        iterations = []
        for step in range(300):
            secrets = [rng.randint(1, GuessNumber.N) for _ in range(8)]
            if step < SFT_ITERATIONS:  # the SFT policy's batches: some groups win, some lose
                iterations.append(it(sum(guess_returns("first", secrets)) / 8, zero_groups=0.5))
            else:
                score = sum(guess_returns("binary", secrets)) / 8
                iterations.append(it(score, zero_groups=1.0, entropy=0.001))
        flagged["sft level"] += max(watched(iterations, best=GuessNumber.best_return)[1]) >= STUCK_AFTER
        flagged["best so far"] += best_so_far_rule(iterations) >= STUCK_AFTER
    assert flagged == {"sft level": 0, "best so far": 26}


def test_a_run_tied_from_its_first_iteration_is_stuck_below_the_best(capsys):
    """Every group tied from the start (the SFT policy loses every episode): no iteration ever
    had a signal, so there is no SFT level to fall below; it is stuck unless the reward is the
    most an episode can return."""
    tied = [it(0.0, zero_groups=1.0, entropy=0.3)] * (STUCK_AFTER + 2)
    _, stuck = watched(tied, best=1.0)
    assert stuck == list(range(1, STUCK_AFTER + 3))
    out = capsys.readouterr().out
    assert "since its first iteration, at a reward of 0.000 below the most a response can earn (1)" in out
    _, stuck = watched([it(1.0, zero_groups=1.0)] * 20, best=1.0)  # won from the start: done
    assert max(stuck) == 0
    _, stuck = watched(tied, best=None)  # a reward without a known best: said, with the caveat
    assert stuck[-1] == STUCK_AFTER + 2
    assert "if that is the most a response can earn, the run is done" in capsys.readouterr().out


def test_a_signal_resets_the_count():
    _, stuck = watched(LEARNING + [it(0.1, zero_groups=1.0)] * 3 + [it(0.1)] + [it(0.1, 1.0)] * 2)
    assert stuck[4:] == [1, 2, 3, 0, 1, 2]


def test_a_resumed_watch_counts_on_from_the_logged_lines():
    """--resume: the count, the SFT level and the scores come back from the logged iterations."""
    iterations = LEARNING + [it(0.0, zero_groups=1.0)] * 6
    whole, stuck = watched(iterations + [it(0.0, zero_groups=1.0)])
    resumed = RunWatch(cfg())
    resumed.resume(iterations)
    assert resumed.check(it(0.0, zero_groups=1.0), len(iterations) + 1, BETA)["stuck"] == stuck[-1] == 7
    assert resumed.sft_level == whole.sft_level == (0.5 + 0.6 + 0.75) / 3


def test_beta_held_at_its_upper_bound_is_said_once(capsys):
    """The adaptive controller at its bound (a collapsed run's KL far above target): one line,
    naming beta, the bound and the KL."""
    ctl = AdaptiveKLController(0.2, 3.0, 10.0)
    watch = RunWatch(cfg())
    for step in range(1, 40):
        ctl.update(45.0)
        watch.check(it(0.5, kl=45.0), step, ctl)
    out = capsys.readouterr().out
    assert out.count("reached its upper bound") == 1
    assert "beta 2, 10x --kl_coef" in out and "KL at 45.0 nats against --kl_target 3" in out


# ----------------------------------------------------------------------------- recorded runs
# Per-iteration figures of three real runs (bench/stuck_fixtures.py wrote them; the first line
# of each file names its command): the watch replayed on them says what the run said, and the
# right thing.
FIXTURES = Path(__file__).parent / "fixtures" / "stuck"


def recorded(name: str) -> tuple[dict, list[dict]]:
    head, *rows = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    assert head["run"] == name and head["command"].startswith("python train_ppo.py")
    return head, rows


def replayed(rows: list[dict]) -> list[int]:
    return watched([{**r, "reward": r["score"]} for r in rows], best=1.0, kl_ctl=BETA)[1]


def test_a_recorded_collapsed_duel_run_is_called_stuck():
    """The corridor game at the --env defaults (seed 0, --actor_lr 1e-4) fell onto the empty
    answer at its 21st iteration: every group lost and tied for 48 iterations, far below the SFT
    level; the watch counts from the fall and says so at STUCK_AFTER."""
    head, rows = recorded("collapsed")
    stuck = replayed(rows)
    assert stuck == [r["stuck"] for r in rows]  # what the run logged
    collapsed = next(i for i, r in enumerate(rows) if r["zero_groups"] == 1.0 and r["score"] == 0.0)
    assert max(stuck) >= STUCK_AFTER and stuck.index(STUCK_AFTER) == collapsed + STUCK_AFTER - 1
    assert sum(r["score"] for r in rows[:SFT_ITERATIONS]) > 0  # there was a level to fall from


def test_a_recorded_run_tied_from_the_start_is_called_stuck():
    """The duel game with one turn: no pile can be taken in one move, every group ties unwon
    from the first iteration; the old best-so-far rule never fired on it."""
    head, rows = recorded("tied")
    assert all(r["zero_groups"] == 1.0 for r in rows) and max(r["score"] for r in rows) < 1.0
    stuck = replayed(rows)
    assert stuck == [r["stuck"] for r in rows] == list(range(1, len(rows) + 1))
    assert best_so_far_rule(rows) == 0


def test_a_recorded_guessing_game_run_at_its_plateau_is_never_called_stuck():
    """GRPO on the guessing game for 400 iterations: its batch reward rises from its SFT level
    and wanders with the secrets drawn; never stuck. A real run keeps sampling (its groups do
    not tie), so the old rule did not flag it either: the simulation above is the deterministic
    policy where it did."""
    head, rows = recorded("converged")
    level = sum(r["score"] for r in rows[:SFT_ITERATIONS]) / SFT_ITERATIONS
    tail = rows[-100:]
    assert sum(r["score"] for r in tail) / len(tail) > level
    stuck = replayed(rows)
    assert stuck == [r["stuck"] for r in rows] and max(stuck) == 0
    assert best_so_far_rule(rows) == 0
