"""The bench scripts' summary modes run at this revision on their committed JSON: a bench that
calls a function the package has moved fails here, not hours into a study."""
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
])
def test_a_summary_runs_on_the_committed_results(tmp_path, script, json_name, flag, expect):
    source = os.path.join(ROOT, "bench", "results", json_name)
    if not os.path.exists(source):
        pytest.skip(f"bench/results/{json_name} is not committed yet")
    copy = tmp_path / json_name
    shutil.copy(source, copy)
    extra = ["--game", "duel"] if script == "user_games.py" else []
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), flag,
                           "--results", str(copy), *extra], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout


def test_corridor_moves_counts_left_moves_per_door():
    """bench/corridor_moves.py on two hand-written episodes of the last recorded iteration
    (an earlier iteration's episode is left out): door 0 walked left twice, door 8 left then
    right, then EOS and the environment's tokens that are not moves."""
    from conftest import bench_module
    moves = bench_module("corridor_moves")
    def episode(step, door, tokens, env):
        return {"step": step, "prompt": f"a corridor of 9 cells . you are at 4 , the door is at {door} .",
                "tokens": tokens, "env": env}
    rollouts = [episode(20, 0, ["right", " right"], [0, 0]),
                episode(40, 0, ["left", " <eos>", " you", " left"], [0, 0, 1, 0]),
                episode(40, 8, ["left", " <eos>", " left", " right"], [0, 0, 1, 0])]
    assert moves.moves_by_door(rollouts) == {"step": 40, "left_share_door_0": 1.0,
                                             "left_share_door_8": 0.5}
