"""The JSON file of a resumable benchmark: read what earlier sittings measured, write after
every run (atomically: a temporary file, then a rename, so a killed bench never leaves half a
file), so that a bench killed or stopped goes on where it was."""
from __future__ import annotations

import json
import os
import subprocess
import time


def load(path: str) -> dict:
    """The results in `path`, or a fresh {"runs": {}}."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"runs": {}}


def save(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def over_seeds(runs: dict, figures) -> dict:
    """{row: {"seeds": n, figure: {"mean", "min", "max", "n"}}} of `runs` keyed "row/.../seed":
    each row's figures over its seeds, n of them having the figure (one no run of the row has is
    left out)."""
    by = {}
    for key, r in runs.items():
        by.setdefault(key.rsplit("/", 1)[0], []).append(r)
    summary = {}
    for row, rs in by.items():
        s = {"seeds": len(rs)}
        for k in figures:
            v = [r[k] for r in rs if k in r]
            if v:
                s[k] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}
        summary[row] = s
    return summary


def merge(path: str, others: list[str]) -> dict:
    """The results in `path` with the runs of the files `others` added (seeds that another
    process ran at the same time into its own file); the caller saves it."""
    result = load(path)
    for other in others:
        result["runs"].update(load(other)["runs"])
    return result


def train_stage(main, config_class, out_dir: str, **options) -> None:
    """Run a training script's `main` into out_dir unless a run there already finished (its
    metrics.jsonl ends with the final summary; an ensemble of reward models, its
    ensemble.json); a run that was killed part-way (a checkpoint, no summary; an ensemble's
    first member) is resumed, never taken for a finished one."""
    from mingpt_rlhf.lab.ensemble import is_ensemble
    from mingpt_rlhf.run.metrics import read_metrics
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if os.path.exists(metrics) and any(r.get("final") for r in read_metrics(metrics)[-1:]):
        return
    if options.get("ensemble", 1) > 1 and is_ensemble(out_dir):
        return
    resume = any(os.path.exists(os.path.join(out_dir, name, "ckpt.pt")) for name in ("", "member0"))
    main(config_class(out_dir=out_dir, resume=resume, **options))


def variant_tag(options: str) -> str:
    """The key's tag of a variant: "--kl_in loss --kl_coef 0.2" -> "[kl_in=loss,kl_coef=0.2]"
    (no spaces, so that docs can name a run's figures); "" for the defaults."""
    words = options.split()
    if len(words) % 2 or not all(w.startswith("--") for w in words[::2]):
        raise SystemExit(f"--options takes flags with one value each, as \"--kl_coef 0.2\": "
                         f"not {options!r}")
    pairs = [f"{flag[2:]}={value}" for flag, value in zip(words[::2], words[1::2])]
    return f"[{','.join(pairs)}]" if pairs else ""


def measured(root: str) -> str:
    """When and at which commit of the repository at `root` a run was made, and whether its
    tracked files had changes not yet committed ("2026-11-27 a5b235e", or "2026-11-27 a5b235e
    with uncommitted changes": then the commit alone does not say what ran). The results
    folder does not count: a study writes its own JSON there after every run."""
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no",
                                "--", ".", ":!bench/results"],
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown commit", ""
    return f"{time.strftime('%Y-%m-%d')} {commit}" + (" with uncommitted changes" if dirty else "")


def ran_with(out_dir: str) -> dict:
    """The options a training run in `out_dir` ran with, as its checkpoint saved them (every
    "auto" resolved): those that differ from its script's defaults, so the defaults of the day
    need not be known to read them."""
    import importlib

    import torch
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=False)
    saved = ckpt.get("config", {})
    script = {"sft": "train_sft", "rm": "train_rm", "dpo": "train_dpo"}.get(ckpt.get("stage"), "train_ppo")
    defaults = importlib.import_module(script).Config()
    skip = ("out_dir", "sft_dir", "rm_dir", "resume")  # where, not what
    return {k: v for k, v in saved.items()
            if k not in skip and getattr(defaults, k, object()) != v}
