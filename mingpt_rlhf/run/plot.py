"""Curves of training runs from their metrics.jsonl: one figure, several runs overlaid.

    python -m mingpt_rlhf.run.plot out/sft out/rm out/ppo --out curves.png
    python -m mingpt_rlhf.run.plot out/ppo out/grpo out/rloo       # runs of one stage, overlaid

Each run's stage is read from its metrics (SFT, RM, RL for PPO / GRPO / RLOO, DPO) and drawn
on that stage's panels: training figures as lines against step, eval figures as marked points.
matplotlib is an optional extra (`pip install -e ".[plot]"`); without it this command exits
with status 2 and says so, and the training scripts skip their end-of-run picture.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from ..machinery.cli import OneLineParser
from ..machinery.errors import UserError
from .metrics import read_metrics

# stage -> panels; each panel: title and the (key, "train" | "eval") series it draws
PANELS = {
    "sft": [("loss", [("loss", "train"), ("eval_loss", "eval")]),
            ("well_formed", [("well_formed", "eval")]), ("gold", [("gold", "eval")]),
            ("success (episodes)", [("success", "eval")]), ("turns (episodes)", [("turns", "eval")])],
    "rm": [("loss", [("loss", "train"), ("eval_loss", "eval")]),
           ("accuracy", [("acc", "train"), ("eval_acc", "eval"), ("eval_gold_acc", "eval")])],
    "rl": [("reward and gold", [("rm_score", "train"), ("reward", "train"), ("gold", "eval")]),
           ("kl (nats per response)", [("kl", "train"), ("kl", "eval")]),
           ("kl_coef", [("kl_coef", "train")]), ("entropy", [("entropy", "train")]),
           ("clipfrac, approx_kl", [("clipfrac", "train"), ("approx_kl", "train")]),
           ("resp_len", [("resp_len", "train")]), ("eos_rate", [("eos_rate", "train")]),
           ("groups with no signal", [("zero_groups", "train"), ("dropped_groups", "train")]),
           ("sampler vs learner KL", [("mismatch_kl", "train")]),
           ("success (episodes)", [("success", "train"), ("success", "eval")]),
           ("turns (episodes)", [("turns", "train"), ("turns", "eval")])],
    "dpo": [("loss", [("loss", "train")]), ("reward_acc", [("reward_acc", "train")]),
            ("margin", [("margin", "train")]), ("gold", [("gold", "eval")])],
}


def read_run(folder: str) -> tuple[str, list[dict], list[dict]]:
    """(stage, training rows, eval rows) of the run in `folder`."""
    path = os.path.join(folder, "metrics.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"no metrics at {path}; pass the out_dir of a training run")
    rows = read_metrics(path)  # a half-written last line (a killed run) is dropped
    train = [r for r in rows if "split" not in r and "final" not in r]
    evals = [r for r in rows if r.get("split") == "eval"]
    return stage_of(rows, path), train, evals


def stage_of(rows: list[dict], path: str) -> str:
    """The stage whose figures the metrics rows (of the file at `path`) hold."""
    keys = set().union(*rows) if rows else set()
    stage = ("dpo" if "reward_acc" in keys else "rl" if "kl_coef" in keys else
             "rm" if "eval_acc" in keys or "acc" in keys else "sft" if "eval_loss" in keys else None)
    if stage is None:
        raise UserError(f"{path} has no figures of a known stage (SFT, RM, PPO/GRPO/RLOO, DPO)")
    return stage


def plot_runs(folders: list[str], out_path: str) -> str:
    """Draw the runs in `folders` into `out_path` (PNG); returns the path."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError('plotting needs matplotlib: pip install -e ".[plot]"') from None
    runs = [(folder, *read_run(folder)) for folder in folders]
    stages = [s for s in PANELS if any(r[1] == s for r in runs)]
    # a panel is drawn when some run of its stage has one of its figures (a run of episodes
    # has success and turns, a run on prompts gold and well_formed)
    keys = {s: set().union(*(set().union(*r[2], *r[3]) for r in runs if r[1] == s)) for s in stages}
    panels = [(s, title, series) for s in stages for title, series in PANELS[s]
              if any(key in keys[s] for key, _ in series)]
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (stage, title, series) in zip(axes.flat, panels):
        for i, (folder, run_stage, train, evals) in enumerate(runs):
            if run_stage != stage:
                continue
            name = os.path.basename(os.path.normpath(folder))
            for j, (key, source) in enumerate(series):
                data = [(r["step"], r[key]) for r in (train if source == "train" else evals) if key in r]
                if not data:
                    continue
                x, y = zip(*data)
                label = name if len(series) == 1 else f"{name} {key}"
                # one colour per run; eval points marked, a second training series dotted
                style = dict(color=colors[i % len(colors)])
                if source == "eval":
                    ax.plot(x, y, marker="o", markersize=4, linestyle="--",
                            label=label + (" (eval)" if len(series) > 1 else ""), **style)
                else:
                    ax.plot(x, y, linewidth=1, linestyle="-" if j == 0 else ":", label=label, **style)
        ax.set_title(f"{stage}: {title}", fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise UserError(f"cannot write {out_path}: no folder {folder}")
    try:
        fig.savefig(out_path, dpi=100)
    except OSError as e:
        raise UserError(f"cannot write {out_path} ({e.strerror or e}); pass another --out") from None
    finally:
        plt.close(fig)
    return out_path


def picture_of_run(out_dir: str) -> str | None:
    """The training scripts' end-of-run picture, out_dir/curves.png; None (and nothing drawn)
    without matplotlib, plots being optional, or with MINGPT_RLHF_PLOT=0 (the tests set it)."""
    from ..machinery.distributed import is_main
    if os.environ.get("MINGPT_RLHF_PLOT", "1") == "0" or not is_main():
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    try:
        path = plot_runs([out_dir], os.path.join(out_dir, "curves.png"))
    except UserError as e:  # the run itself is done and saved: a picture is not worth failing it
        print(f"note: no curves drawn: {e}")
        return None
    print(f"curves: {path}")
    return path


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m mingpt_rlhf.run.plot", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="out_dir folders of training runs (with metrics.jsonl)")
    ap.add_argument("--out", default="curves.png", help="the PNG to write (default: curves.png)")
    return ap


def main(argv=None) -> None:
    try:
        args = build_parser().parse_args(argv)
        print(f"wrote {plot_runs(args.runs, args.out)}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
