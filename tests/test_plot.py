"""The plot command on small metrics.jsonl files written here: a valid PNG, one panel set per
stage, several runs overlaid; without matplotlib or with a wrong folder, exit 2 and one line."""
import json
import sys

import pytest

from mingpt_rlhf.run import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def rl_rows(shift=0.0):
    train = [{"step": s, "rm_score": 0.1 * s + shift, "kl": 0.2 * s, "kl_coef": 0.05, "entropy": 3.0,
              "clipfrac": 0.1, "approx_kl": 0.01, "resp_len": 8, "eos_rate": 1.0} for s in range(1, 6)]
    if shift:  # a grpo run with dynamic sampling and a lagging sampler: their panels too
        for r in train:
            r.update(zero_groups=0.25, dropped_groups=0.25, mismatch_kl=0.001)
    evals = [{"step": s, "split": "eval", "gold": 0.1 * s, "kl": 0.2 * s} for s in (0, 5)]
    return train + evals + [{"step": 5, "final": True, "gold": 0.5}]


def runs_of_every_stage(tmp_path):
    return [
        write_run(tmp_path / "sft", [{"step": 0, "loss": 3.0}, {"step": 10, "loss": 2.0},
                                     {"step": 10, "split": "eval", "eval_loss": 2.1, "well_formed": 0.9, "gold": 0.0}]),
        write_run(tmp_path / "rm", [{"step": 0, "loss": 0.7, "acc": 0.5},
                                    {"step": 5, "split": "eval", "eval_loss": 0.6, "eval_acc": 0.7, "eval_gold_acc": 0.8}]),
        write_run(tmp_path / "ppo", rl_rows()),
        write_run(tmp_path / "grpo", rl_rows(shift=0.3)),
        write_run(tmp_path / "dpo", [{"step": s, "loss": 0.69 - 0.01 * s, "reward_acc": 0.6, "margin": 0.1 * s}
                                     for s in range(3)] + [{"step": 2, "split": "eval", "gold": 0.4}]),
    ]


def test_every_stage_is_recognised(tmp_path):
    stages = [plot.read_run(folder)[0] for folder in runs_of_every_stage(tmp_path)]
    assert stages == ["sft", "rm", "rl", "rl", "dpo"]


def test_writes_a_valid_png_with_a_panel_per_figure(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    plot.main([*runs_of_every_stage(tmp_path), "--out", str(out)])
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    import matplotlib.image
    image = matplotlib.image.imread(str(out))
    # 4 columns, one row per 4 panels; these runs answer prompts: no panels of episodes
    panels = sum(1 for p in plot.PANELS.values() for title, _ in p if "episodes" not in title)
    assert image.shape[1] == 4 * 4 * 100 and image.shape[0] == -(-panels // 4) * 3 * 100
    assert matplotlib.get_backend().lower() == "agg"


def test_a_training_script_draws_its_own_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    folder = write_run(tmp_path / "ppo", rl_rows())
    monkeypatch.setenv("MINGPT_RLHF_PLOT", "0")
    assert plot.picture_of_run(folder) is None
    monkeypatch.setenv("MINGPT_RLHF_PLOT", "1")
    assert plot.picture_of_run(folder) == str(tmp_path / "ppo" / "curves.png")
    assert (tmp_path / "ppo" / "curves.png").read_bytes()[:8] == PNG_SIGNATURE


def test_without_matplotlib_exits_2_saying_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(SystemExit) as e:
        plot.main([write_run(tmp_path / "ppo", rl_rows()), "--out", str(tmp_path / "c.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and 'pip install -e ".[plot]"' in err[0]
    assert plot.picture_of_run(str(tmp_path / "ppo")) is None  # the scripts just skip it


@pytest.mark.parametrize("make,needle", [
    (lambda p: str(p / "nothing"), "no metrics at"),
    (lambda p: (p / "bin").mkdir() or (p / "bin" / "metrics.jsonl").write_bytes(b"\xff\xfe") and str(p / "bin"),
     "not a metrics file"),
    (lambda p: write_run(p / "odd", [{"step": 0, "something": 1}]), "no figures of a known stage"),
])
def test_bad_folders_exit_2_with_one_line(tmp_path, capsys, make, needle):
    with pytest.raises(SystemExit) as e:
        plot.main([make(tmp_path), "--out", str(tmp_path / "c.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and needle in err[0]
