"""The bench scripts' summary modes run at this revision on their committed JSON: a bench that
calls a function the package has moved fails here, not hours into a study."""
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script,json_name,flag,expect", [
    ("multiturn.py", "multiturn.json", "--draw_only", "success"),
    ("passk.py", "passk.json", "--table", "@1"),
    ("user_games.py", "user_games_duel.json", "--summary_only", ""),
    ("passk_games.py", "passk_games_corridor.json", "--table", "@1024"),
    ("distill.py", "distill.json", "--summary_only", "teacher: gold"),
])
def test_a_summary_runs_on_the_committed_results(tmp_path, script, json_name, flag, expect):
    source = os.path.join(ROOT, "bench", "results", json_name)
    if not os.path.exists(source):
        pytest.skip(f"bench/results/{json_name} is not committed yet")
    copy = tmp_path / json_name
    shutil.copy(source, copy)
    extra = {"user_games.py": ["--game", "duel"], "passk_games.py": ["--game", "corridor"]}.get(script, [])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), flag,
                           "--results", str(copy), *extra], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout


def test_first_moves_names_every_opening_and_its_right_move():
    """bench/first_moves.py enumerates the duel's six piles (right: the move that leaves a
    multiple of 3) and the corridor's twelve starts (right: towards the door)."""
    from conftest import bench_module
    first = bench_module("first_moves")
    duel = first.openings("duel")
    assert {name: right for name, (_, right, *_) in duel.items()} == {
        "pile 4": "one", "pile 5": "two", "pile 7": "one", "pile 8": "two", "pile 10": "one",
        "pile 11": "two"}
    assert all(text.startswith(name.split()[1] + " stones") for name, (text, *_) in duel.items())
    # by hand: from 4, taking two leaves 2, and the opponent takes both half the time; from 11,
    # taking one leaves 10: the opponent leaves 8 (we win) or 9, from which we win 7 of 8
    # (leave 8: the opponent leaves 7, ours, or 6, from which we win 3 of 4)
    assert duel["pile 4"][2] == 0.5 and duel["pile 11"][2] == 15 / 16
    corridor = first.openings("corridor")
    assert len(corridor) == 12
    assert {right for name, (_, right, *_) in corridor.items() if name.startswith("door 0")} == {"left"}
    assert {right for name, (_, right, *_) in corridor.items() if name.startswith("door 8")} == {"right"}
    # a step away from a door 4 cells off leaves 5 cells for the 5 moves left; from 5 cells, 6
    assert corridor["door 0 at 4"][2] == 1.0 and corridor["door 0 at 5"][2] == 0.0


def test_first_moves_reads_the_probability_the_sampler_draws_with():
    """The probability of each move after an opening equals exp of the log-prob the trainer's
    own function gives that move as a one-token response (PAD suppressed), on a random GPT."""
    from conftest import bench_module
    import torch
    from mingpt_rlhf.logprobs import sequence_logprobs
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.tokenizer import WordTokenizer
    first = bench_module("first_moves")
    openings = first.openings("corridor")
    tok = WordTokenizer.from_texts([t for t, *_ in openings.values()] + ["left right"])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                          n_embd=32)).eval()
    text = openings["door 8 at 3"][0]
    p = first.move_probabilities(model, tok, text, ("left", "right"))
    for word in ("left", "right"):
        seq = torch.tensor([tok.encode(text) + tok.encode(word)])
        lp = sequence_logprobs(model, seq, torch.ones_like(seq), seq.size(1) - 1,
                               suppress=tok.pad_id)[0]
        assert abs(p[word] - lp.exp().item()) < 1e-5
    assert 0 < p["left"] + p["right"] < 1


def test_passk_games_says_from_which_k_the_starting_policy_is_above():
    """A policy above the SFT policy at small k and below it from k = 4 on: start_above_from
    is 4 and start_above_by the largest margin; the SFT policy itself is never above itself."""
    from conftest import bench_module
    games = bench_module("passk_games")
    result = {"runs": {"sft": {"pass_at_k": {"1": 0.2, "2": 0.4, "4": 0.7, "8": 1.0}},
                       "rl": {"pass_at_k": {"1": 0.6, "2": 0.6, "4": 0.65, "8": 0.8}}}}
    games.against_start(result)
    assert result["runs"]["rl"]["start_above_from"] == 4
    assert abs(result["runs"]["rl"]["start_above_by"] - 0.2) < 1e-9
    assert result["runs"]["sft"]["start_above_from"] is None and result["runs"]["sft"]["start_above_by"] == 0


def test_passk_reads_a_runs_end_from_its_own_log(tmp_path):
    """bench/passk.py's `trained`: the final summary's accuracy and KL (not an earlier eval's),
    and the rollouts' entropy averaged over the last 20 training iterations only."""
    import json
    from conftest import bench_module
    passk = bench_module("passk")
    rows = [{"step": s, "entropy": 1.0 if s <= 10 else 0.5, "score": 0.1} for s in range(1, 31)]
    rows += [{"step": 20, "split": "eval", "gold": 0.5, "gold_unseen": 0.4, "kl": 0.1},
             {"step": 30, "split": "eval", "gold": 0.9, "gold_unseen": 0.8, "kl": 0.3},
             {"step": 30, "final": True, "gold": 0.9, "gold_unseen": 0.8, "kl": 0.3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    end = passk.trained(str(tmp_path))
    assert (end["gold"], end["gold_unseen"], end["kl"]) == (0.9, 0.8, 0.3)
    assert abs(end["entropy"] - 0.5) < 1e-12          # iterations 11-30: all 0.5


def test_entropy_fit_recovers_the_law_it_is_given(tmp_path):
    """bench/entropy_fit.py on a run whose evals lie exactly on R = -a exp(H) + b (a = 0.5,
    b = 1.2): a, b back, r2 1, and R(H = 0) = b - a = 0.7; the entropy paired with each eval
    is the training line's of the same step, not an eval's."""
    import json
    import math
    from conftest import bench_module
    fit = bench_module("entropy_fit")
    rows = []
    for step, h in [(10, 0.4), (20, 0.3), (30, 0.2), (40, 0.1)]:
        rows.append({"step": step, "entropy": h})
        rows.append({"step": step, "split": "eval", "entropy": 9.0, "gold": -0.5 * math.exp(h) + 1.2})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = fit.main([str(tmp_path / "run"), "--json", str(tmp_path / "f.json")])
    assert abs(out["all"]["a"] - 0.5) < 1e-9 and abs(out["all"]["b"] - 1.2) < 1e-9
    assert abs(out["all"]["r2"] - 1) < 1e-9
    assert abs(out["all"]["predicted_at_zero_entropy"] - 0.7) < 1e-9
    assert json.loads((tmp_path / "f.json").read_text())["command"].startswith("python bench/entropy_fit.py")
    with pytest.raises(SystemExit) as exit_:
        fit.main([str(tmp_path / "nowhere")])
    assert exit_.value.code == 2


def test_passk_draws_its_picture_from_the_committed_results(tmp_path):
    """`bench/passk.py --draw` writes passk.png beside the JSON it is given."""
    pytest.importorskip("matplotlib")
    shutil.copy(os.path.join(ROOT, "bench", "results", "passk.json"), tmp_path / "passk.json")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "passk.py"), "--draw",
                           "--results", str(tmp_path / "passk.json")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "passk.png").stat().st_size > 10_000


def test_kl_control_records_the_defaults_as_the_run_resolves_them():
    """bench/kl_control.py writes the runs' shared options into its JSON: the values they train
    with, not the "auto" sentinels (Config().kl_coef is -1, which a re-run recorded)."""
    from conftest import bench_module
    defaults = bench_module("kl_control").run_defaults()
    assert defaults["kl_coef"] == 0.05 and defaults["kl_horizon"] == 10.0
    assert all(v > 0 for v in defaults.values()), defaults


def test_a_run_records_the_options_it_ran_with(tmp_path):
    """results_file.ran_with reads a run's checkpoint: its options as resolved (the "auto"s
    replaced), those that differ from the script's defaults."""
    import torch
    from conftest import bench_module
    results_file = bench_module("results_file")
    torch.save({"stage": "grpo", "config": {"out_dir": "x", "algo": "grpo", "kl_coef": 0.2,
                                            "max_iters": 200, "kl_in": "loss"}},
               tmp_path / "ckpt.pt")
    assert results_file.ran_with(str(tmp_path)) == {"algo": "grpo", "kl_coef": 0.2, "kl_in": "loss"}
    assert results_file.measured(str(tmp_path)).startswith("20")  # a date, whatever the folder


def test_kl_bound_cost_takes_away_the_lower_bound_only():
    """bench/kl_bound_cost.py's patch: beta held below target falls past kl_coef / 10 (as it
    did before the bound), and is still held at 10 x kl_coef above target."""
    from conftest import bench_module

    from mingpt_rlhf import ppo
    original = ppo.AdaptiveKLController.__init__
    try:
        bench_module("kl_bound_cost").without_lower_bound()
        ctl = ppo.AdaptiveKLController(0.2, target=3.0, horizon=10)
        for _ in range(300):
            ctl.update(0.5)  # far below target: the slowest fall, 2 % an iteration
        assert ctl.value < 0.2 / 10 and ctl.value == pytest.approx(0.2 * math.exp(-0.02 * 300))
        for _ in range(300):
            ctl.update(300.0)
        assert ctl.value == pytest.approx(2.0)
    finally:
        ppo.AdaptiveKLController.__init__ = original
    assert ppo.AdaptiveKLController(0.2, 3.0, 10).low == pytest.approx(0.02)  # restored


def test_user_games_summary_gives_each_seeds_lowest_eval():
    from conftest import bench_module
    user_games = bench_module("user_games")
    runs = {f"grpo/0.0001/{s}": {"win": w, "sft_win": 0.5, "collapsed": w < 0.5, "stuck_iterations": 0,
                                 "evals": [[0, 0.5], [20, low], [40, w]]}
            for s, (low, w) in enumerate([(0.0, 0.9), (0.6, 0.95), (0.4, 0.45)])}
    s = user_games.summary({"runs": runs})["grpo/0.0001"]
    assert s["lowest"] == [0.0, 0.6, 0.4]
    assert (s["dipped"], s["came_back"], s["collapsed"]) == (2, 1, 1)
