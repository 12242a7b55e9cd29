"""metrics.jsonl after a run was killed while writing it: --resume and plot drop the half line."""
import json
import os

import pytest

from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.run.metrics import MetricsLog, read_metrics

ROWS = [{"step": 0, "time": 0.1, "loss": 3.0}, {"step": 10, "time": 1.0, "loss": 2.0},
        {"step": 20, "time": 2.0, "loss": 1.5}, {"step": 20, "time": 2.1, "split": "eval", "eval_loss": 1.6}]


def write(folder, text):
    path = os.path.join(folder, "metrics.jsonl")
    with open(path, "w") as f:
        f.write(text)
    return path


def whole(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_resume_drops_a_half_written_last_line_and_goes_on(tmp_path, capsys):
    path = write(tmp_path, whole(ROWS) + '{"step": 30, "time": 3.0, "lo')  # killed mid-line
    log = MetricsLog(str(tmp_path), resume_step=20)
    assert "half-written last line" in capsys.readouterr().err
    log.log(30, loss=1.2)
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 10, 20, 20, 30] and rows[-1]["loss"] == 1.2


def test_plot_reads_a_run_whose_last_line_is_cut(tmp_path):
    from mingpt_rlhf.run.plot import read_run
    write(tmp_path, whole(ROWS) + '{"step": 30, "ti')
    stage, train, evals = read_run(str(tmp_path))
    assert stage == "sft" and len(train) == 3 and len(evals) == 1


def test_a_broken_line_before_the_end_is_not_ours(tmp_path):
    path = write(tmp_path, whole(ROWS[:1]) + "not json\n" + whole(ROWS[1:]))
    with pytest.raises(UserError, match="line 2"):
        read_metrics(path)
