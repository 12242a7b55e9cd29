"""bench/golden.py: two recordings of the same code are equal, key by key, and a changed
figure or weight is reported by name (exit status 1). The fast test records one run (the tiny
SFT) and compares it with edited copies; the slow one records the whole set twice."""
import json
import shutil

import pytest

from conftest import bench_module


def test_a_golden_record_has_no_clock_and_a_change_is_named(tmp_path, capsys):
    """One run recorded (its log without clock keys, its tensors as hashes, its command with
    folders as <work>); a copy compares the same; a figure of the log and a tensor changed are
    both named, exit 1, and a run only on one side is named. (That two recordings of every run
    are the same to the last bit is the slow test below.)"""
    golden = bench_module("golden")
    a, b = tmp_path / "a", tmp_path / "b"
    assert golden.main(["--out", str(a), "--runs", "sft"]) == 0
    assert sorted(p.name for p in a.iterdir()) == ["sft.json"]
    sft = json.loads((a / "sft.json").read_text())
    lines = sft["files"]["metrics.jsonl"]
    assert lines and not any(golden.is_clock(k) for line in lines for k in line)  # no clock
    assert sft["summary"] == lines[-1] and sft["summary"]["final"]
    weights = [k for k in sft["files"]["ckpt.pt"] if k.startswith("model.")]
    assert weights and all(len(sft["files"]["ckpt.pt"][k]) == 20 for k in weights)  # hashes
    assert sft["commands"][0].startswith("train_sft.py ") and sft["commands"][0].endswith("--out_dir <work>/sft")
    shutil.copytree(a, b)
    capsys.readouterr()
    assert golden.main(["--compare", str(a), str(b)]) == 0
    assert "1 of 1 runs the same" in capsys.readouterr().out

    # one figure of the log and one tensor of the checkpoint changed: both named, exit 1
    sft["files"]["metrics.jsonl"][-1]["eval_loss"] += 1e-6
    sft["summary"]["eval_loss"] += 1e-6
    sft["files"]["ckpt.pt"][weights[0]] = "0" * 20
    (b / "sft.json").write_text(json.dumps(sft))
    shutil.copy(a / "sft.json", a / "rm.json")  # a run recorded on one side only
    assert golden.main(["--compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "sft: 3 differences (summary 1, metrics.jsonl 1, ckpt.pt 1)" in out
    assert f"files.ckpt.pt.{weights[0]}:" in out
    assert f"files.metrics.jsonl[{len(lines) - 1}, step {lines[-1]['step']}].eval_loss:" in out
    assert f"rm: only in {a}" in out and "0 of 2 runs the same, 2 differ" in out


def test_clock_keys_are_left_out_and_folders_written_as_work():
    golden = bench_module("golden")
    entry = {"step": 3, "time": 1.2, "t_learn": 0.5, "load_seconds": 2, "kl": 0.1,
             "out_dir": "/tmp/x/ppo", "nested": [{"elapsed": 1, "loss": 2}]}
    assert golden.plain(entry, "/tmp/x") == {"step": 3, "kl": 0.1, "out_dir": "<work>/ppo",
                                             "nested": [{"loss": 2}]}


def test_every_run_reads_only_runs_before_it():
    golden = bench_module("golden")
    waves = golden.order(list(golden.RUNS))
    assert sorted(n for wave in waves for n in wave) == sorted(golden.RUNS)
    seen = set()
    for wave in waves:
        assert all(set(golden.RUNS[n][2]) <= seen for n in wave)
        seen |= set(wave)
    for name, (script, flags, reads) in golden.RUNS.items():  # every folder it names is read
        named = {f[1:-1] for f in flags if f.startswith("{")}
        assert named <= set(reads), name


@pytest.mark.slow
def test_every_golden_run_is_deterministic(tmp_path):
    """The whole set recorded twice (each run a fresh process on one thread) is the same to
    the last bit: about 4 minutes of one core per recording."""
    golden = bench_module("golden")
    for out in ("a", "b"):
        assert golden.main(["--out", str(tmp_path / out), "--jobs", "2"]) == 0
    assert golden.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    shutil.rmtree(tmp_path)
