"""The run report: one HTML page that shows an RL run from its curves down to single tokens.

    python -m mingpt_rlhf.run.report out/ppo                      # writes out/ppo/report.html
    python -m mingpt_rlhf.run.report out/ppo out/grpo --out rl.html   # several runs overlaid

The page is one self-contained file (its CSS, JavaScript and data inline, pictures drawn as
SVG by the page itself): open it from disk in any browser, no server and no network. It shows

1. each run's options (from its checkpoint) and the final comparison the script printed: the
   held-out figures of the SFT policy (the eval at step 0) against the trained policy's;
2. the curves of metrics.jsonl: reward and gold, KL and its coefficient, entropy, clipfrac and
   approx-KL, response length, the seconds of each phase; values on hover, runs overlaid;
3. the token view, from rollouts.jsonl (run/rollouts.py): every recorded response with each token
   coloured by the quantity the reader picks (advantage, weight in the update, KL, value,
   entropy, reward), all its numbers on hover; one prompt at the first, middle and last eval side by side; an
   environment's tokens marked as such; and a legend saying what the colours mean and what a
   healthy run looks like.

The RL script (train_ppo.py) writes its run's report.html at the end, beside curves.png. A
folder without a run, or a run of another stage, ends with exit status 2 and one line; a run
without rollouts.jsonl (from before it was recorded, or --record_rollouts 0) gets a page
with its curves that says what is missing. The data is embedded as JSON with every "<"
escaped, so no text a policy wrote can close the script element; the page writes tokens into
the document as text, never as HTML.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys

from ..machinery.cli import OneLineParser
from ..machinery.errors import UserError
from .watch import STUCK_AFTER
from ..losses import default_kl_estimator
from .metrics import read_metrics
from .plot import stage_of

HERE = os.path.dirname(os.path.abspath(__file__))
# the figures of the final comparison, in the order train_ppo.py prints them
COMPARED = ["gold", "success", "rm_score", "reward", "turns", "well_formed", "kl", "distinct2"]


def comparison_lines(initial: dict, final: dict, algo: str, held: str = "prompts") -> list[str]:
    """The RL script's closing lines: each held-out figure of the SFT policy (step 0) beside
    the trained policy's. `held`: "prompts" or "episodes"."""
    lines = [f"on held-out {held}, from the SFT policy (step 0) to the {algo.upper()} policy:"]
    for k in COMPARED:
        if k in final and k in initial:
            lines.append(f"  {k:12s} {initial[k]:8.3f} -> {final[k]:8.3f}")
    return lines


def update_counts(rows: list[dict]) -> dict:
    """How the run's updates went, from its training lines: `iterations`, `early_stops` (the
    approx-KL early stop, --target_kl, ended the update before its last minibatch) and
    `idle_updates` (the update took no optimizer step at all: stopped before its first step,
    dynamic sampling kept no group, or every loss was non-finite). An idle update is an
    iteration the run did not learn from. `stuck`: [first iteration, length] of each stretch of
    STUCK_AFTER or more iterations without a reward signal, below the SFT level
    (run/watch.py)."""
    train = [r for r in rows if "minibatch_steps" in r and "split" not in r and not r.get("final")]
    stuck = []  # [first iteration, length] of each stretch of STUCK_AFTER or more
    for r in train:
        k = r.get("stuck", 0)
        if k == STUCK_AFTER:
            stuck.append([r["step"] - k + 1, k])
        elif k > STUCK_AFTER and stuck:
            stuck[-1][1] = k
    return {"iterations": len(train),
            "early_stops": sum(r.get("early_stop_kl", 0) > 0 for r in train),
            "idle_updates": sum(r["minibatch_steps"] == 0 for r in train), "stuck": stuck}


def update_lines(counts: dict) -> list[str]:
    """The closing lines on the updates (`update_counts`): how many the early stop cut short,
    and a warning when some took no step."""
    n = counts["iterations"]
    lines = [f"updates: {counts['early_stops']} of {n} stopped early by --target_kl"]
    if counts.get("stuck"):
        lines.append(f"warning: the run was stuck (no reward signal, its reward below its SFT level) "
                     f"in {sum(k for _, k in counts['stuck'])} of {n} iterations, from iteration "
                     f"{', '.join(str(i) for i, _ in counts['stuck'])} (see stuck in metrics.jsonl)")
    if counts["idle_updates"]:
        lines.append(f"warning: {counts['idle_updates']} of {n} updates took no optimizer step "
                     f"(see minibatch_steps and early_stop_kl in metrics.jsonl): the run learned "
                     f"from fewer iterations than it ran")
    return lines


def cut_short(path: str) -> bool:
    """Whether the log at `path` ends in a half-written line (every whole line ends in a
    newline; a run killed while appending leaves one without)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def run_options(folder: str) -> dict | None:
    """The options the run was started with, from its checkpoint (None when it has none)."""
    from ..machinery.checkpoint import load_checkpoint
    path = os.path.join(folder, "ckpt.pt")
    if not os.path.isfile(path):
        return None
    try:  # mapped: the weights beside the options are never read
        return load_checkpoint(path, mmap=True).get("config")
    except UserError:
        return None


def kl_legend(options: dict | None) -> str:
    """What the KL penalty charges, for the token view's KL legend. The summed log-ratio x is
    the logged kl, but the penalty is beta x the run's --kl_estimator of each token (k1 = x,
    k2 = x^2 / 2, k3 = e^(-x) + x - 1), in the reward or in the loss (--kl_in): only k1 in
    the reward charges that sum. A run whose options are unknown gets both defaults."""
    summed = "Summed over the response it is the kl of the curves (the k1 estimate of the KL)"
    estimate = {"k1": "this number itself", "k2": "x^2 / 2 for this number x",
                "k3": "e^(-x) + x - 1 for this number x"}
    where = {"reward": "in the reward, on each token (GRPO and RLOO: summed, once per response)",
             "loss": "in the loss, reduced like the surrogate, and nothing in the reward"}
    placement = (options or {}).get("kl_in")
    if placement not in where:  # no checkpoint, or "auto" from before it was resolved
        return (f"{summed}. The penalty charges beta x that sum in the reward (--kl_in "
                f"reward), or beta x the k3 estimate of each token, {estimate['k3']}, in the "
                f"loss (--kl_in loss); this run's placement is unknown.")
    estimator = options.get("kl_estimator")
    if estimator not in estimate:  # a run from before --kl_estimator, or "auto"
        estimator = default_kl_estimator(placement)
    return (f"{summed}; this run's penalty (--kl_in {placement}, --kl_estimator {estimator}) "
            f"charges beta x the {estimator} estimate of each token, {estimate[estimator]}, "
            f"{where[placement]}.")


def read_report_run(folder: str) -> dict:
    """Everything the page shows of the run in `folder`: its name, metrics rows, rollouts
    (None when not recorded), options, final comparison, and a note for each missing part."""
    path = os.path.join(folder, "metrics.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"no metrics at {path}; pass the out_dir of a training run")
    rows = read_metrics(path)  # a half-written last line (a killed run) is dropped
    stage = stage_of(rows, path)
    if stage != "rl":
        raise UserError(f"{folder} is a run of stage {stage.upper()}; the report shows RL runs "
                        f"(train_ppo.py): pass an RL run's out_dir")
    evals = [r for r in rows if r.get("split") == "eval"]
    missing = [f"the last line of {name} was half-written (the run was stopped while writing "
               f"it) and is left out" for name in ("metrics.jsonl", "rollouts.jsonl")
               if cut_short(os.path.join(folder, name))]
    path = os.path.join(folder, "rollouts.jsonl")
    rollouts = read_metrics(path, "rollouts file") if os.path.isfile(path) else None
    if not rollouts:
        missing.append(f"no recorded rollouts ({path} {'is empty' if rollouts == [] else 'is missing'}): "
                       f"the run was made before rollouts were recorded, or with "
                       f"--record_rollouts 0; the curves are all there is")
        rollouts = None
    options = run_options(folder)
    if options is None:
        missing.append(f"no readable checkpoint at {os.path.join(folder, 'ckpt.pt')}: the run's "
                       f"options are unknown")
    finals = [r for r in rows if r.get("final")]
    comparison = []
    if evals and evals[0]["step"] == 0 and finals:
        algo = (options or {}).get("algo") or "RL"
        held = "episodes" if "turns" in evals[0] else "prompts"
        comparison = comparison_lines(evals[0], finals[-1], algo, held)
        comparison += update_lines(update_counts(rows))
    elif not finals:
        missing.append("no final line in metrics.jsonl: the run has not finished (or was "
                       "killed); the curves show where it got to")
    return {"name": os.path.basename(os.path.normpath(folder)), "folder": os.path.abspath(folder),
            "rows": rows, "rollouts": rollouts, "options": options, "comparison": comparison,
            "kl_legend": kl_legend(options),
            "missing": missing}


def finite(x):
    """A copy of `x` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def embedded_json(data) -> str:
    """`data` as JSON that is safe inside <script>: every <, > and & written as a \\u escape,
    so that no string (a token "</script>", a prompt with "<!--") can end the element."""
    text = json.dumps(finite(data), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(runs: list[dict]) -> str:
    """The HTML of the report of `runs` (`read_report_run`): the page's CSS and script
    (run/report.css, run/report.js, beside this file) inline, the runs as embedded JSON."""
    with open(os.path.join(HERE, "report.css"), encoding="utf-8") as f:
        css = f.read()
    with open(os.path.join(HERE, "report.js"), encoding="utf-8") as f:
        script = f.read()
    title = "run report: " + ", ".join(r["name"] for r in runs)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>", f"<style>\n{css}</style>", "</head>", "<body>",
        f"<h1>{html.escape(title)}</h1>",
        '<noscript>This page draws itself with JavaScript: allow scripts for this file.</noscript>',
        '<div id="errors"></div>', '<div id="report"></div>',
        f'<script type="application/json" id="data">{embedded_json({"runs": runs})}</script>',
        f"<script>\n{script}</script>", "</body>", "</html>", ""])


def write_report(folders: list[str], out_path: str = "") -> str:
    """Write the report of the runs in `folders` to `out_path` (default: report.html in the
    first folder); returns the path."""
    runs = [read_report_run(folder) for folder in folders]
    out_path = out_path or os.path.join(folders[0], "report.html")
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise UserError(f"cannot write {out_path}: no folder {folder}")
    tmp = f"{out_path}.tmp{os.getpid()}"
    try:  # a temporary file, then a rename: a browser never opens half a page
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page(runs))
        os.replace(tmp, out_path)
    except OSError as e:
        raise UserError(f"cannot write {out_path} ({e.strerror or e}); pass another --out") from None
    return out_path


def report_of_run(out_dir: str) -> str | None:
    """The RL script's end-of-run report, out_dir/report.html, and its path printed; a
    problem is one printed note (the run itself is done and saved)."""
    from ..machinery.distributed import is_main
    if not is_main():
        return None
    try:
        path = write_report([out_dir])
    except UserError as e:
        print(f"note: no report written: {e}")
        return None
    print(f"report: {path} (open it in a browser: file://{os.path.abspath(path)})")
    return path


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m mingpt_rlhf.run.report", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="out_dir folders of RL runs (train_ppo.py)")
    ap.add_argument("--out", default="", help="the HTML file to write (default: report.html in "
                                              "the first run's folder)")
    return ap


def main(argv=None) -> None:
    try:
        args = build_parser().parse_args(argv)
        path = write_report(args.runs, args.out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {path}; open it in a browser: file://{os.path.abspath(path)}")


if __name__ == "__main__":
    main()
