"""metrics.jsonl: what every script logs, one JSON object per line, and how it is read back.

- `MetricsLog` appends a line with "step" and "time" (seconds since the run began, across
  resumes) and the stage's figures, flushed at once so a killed run keeps everything it
  logged. On `--resume` the lines after the checkpoint's step are dropped, so the file reads
  as if the run had never stopped.
- `read_metrics` reads the lines back for `--resume` and for `python -m mingpt_rlhf.run.plot`
  (and `python -m mingpt_rlhf.run.report`, which reads rollouts.jsonl, run/rollouts.py's log of
  JSON lines, the same way; `restart_log` cuts both on `--resume`).
  A run killed while appending (or a full disk) can leave a half-written last line: it is
  dropped with a one-line note, since every line before it is whole. A broken line anywhere
  else means the file is not ours, and is a UserError.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..machinery.errors import UserError


def read_metrics(path: str, kind: str = "metrics file") -> list[dict]:
    """The entries of the metrics file (or another `kind` of JSON-lines log the scripts
    write) at `path` (which must exist), in order."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a {kind} written by the scripts (JSON lines)") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # cut short while being written: the rest is whole
                print(f"note: dropped the half-written last line of {path} (the run was "
                      f"stopped while logging)", file=sys.stderr)
                break
            raise UserError(f"{path} line {number} is not JSON: not a {kind} written by "
                            f"the scripts") from None
        if not isinstance(rows[-1], dict):
            raise UserError(f"{path} line {number} is not a JSON object: not a {kind} "
                            f"written by the scripts")
    return rows


def restart_log(path: str, resume_step: int | None, kind: str = "metrics file") -> None:
    """Start the JSON-lines log at `path` for this run: empty for a new run; on `--resume`
    (`resume_step`, the checkpoint's step) its entries up to that step, the final summary
    left out, so that the file reads as if the run had never stopped."""
    kept = []
    if resume_step is not None and os.path.exists(path):
        kept = [entry for entry in read_metrics(path, kind)
                if entry.get("step", 0) <= resume_step and not entry.get("final")]
    with open(path, "w") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in kept)


class MetricsLog:
    """Appends JSON lines to `out_dir/metrics.jsonl`; `time` is seconds since the run began.
    Under torchrun only rank 0 writes (the others log nothing, and get the entry back)."""

    def __init__(self, out_dir: str, resume_step: int | None = None, time_offset: float = 0.0):
        from ..machinery.distributed import is_main
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.start = time.time() - time_offset
        self.writes = is_main()
        if not self.writes:
            return
        os.makedirs(out_dir, exist_ok=True)
        restart_log(self.path, resume_step)

    def elapsed(self) -> float:
        return time.time() - self.start

    def log(self, step: int, **figures) -> dict:
        entry = {"step": step, "time": round(self.elapsed(), 3)}
        entry.update({k: _plain(v) for k, v in figures.items()})
        if not self.writes:
            return entry
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as e:
            raise UserError(f"cannot append to {self.path} ({e.strerror or e}); free disk space, "
                            f"then --resume (the last checkpoint is intact)") from None
        return entry


def _plain(v):
    """Tensors and numpy numbers to plain Python numbers, rounded for a readable log."""
    if hasattr(v, "item") and callable(v.item):  # a torch tensor or a numpy number
        v = v.item()
    if isinstance(v, float):
        return round(v, 6)
    return v
