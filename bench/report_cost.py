"""What recording rollouts for the run report costs: the default PPO run with and without it.

    python bench/report_cost.py                        # ~10 min on a 2-core CPU (SFT and RM too)
    python bench/report_cost.py --algos ppo grpo --rounds 2

From the built-in pipeline's SFT and RM (trained with their defaults into --work when that
folder does not hold them yet), train_ppo.py runs with its defaults twice per round: once with
`--record_rollouts 8` (the default) and once with `--record_rollouts 0`, in alternating order.
For each run: its wall seconds; inside the recording run, the seconds spent recording
(`RolloutRecorder.seconds`: the rows' entropy pass, grpo / rloo's group rollouts, building and
writing the lines) and writing report.html; the sizes of rollouts.jsonl and report.html.

The recording's share of the run, measured inside the one run, is the figure to quote: the
difference of the two runs' wall seconds is within the noise of a shared machine (a few %).
With Debian's chromium installed, the first PPO run's report is also drawn again and
photographed, headless, into bench/results/report_ppo.png (the picture in docs/scripts.md).
Each run is written to bench/results/report_cost.json as soon as it ends, and one already
there is not run again (--rerun to redo), so an interrupted benchmark continues.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.run.report import write_report  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "report_cost.json")
PICTURE = os.path.join(ROOT, "bench", "results", "report_ppo.png")


def timed_run(cfg: train_ppo.Config) -> dict:
    """train_ppo.main(cfg) with the seconds of its recording and of its report.html."""
    recorders, report_seconds = [], []
    real_recorder, real_report = train_ppo.RolloutRecorder, train_ppo.report_of_run

    def recorder(*args, **kwargs):
        recorders.append(real_recorder(*args, **kwargs))
        return recorders[-1]

    def report(out_dir):
        t0 = time.time()
        path = real_report(out_dir)
        report_seconds.append(time.time() - t0)
        return path
    train_ppo.RolloutRecorder, train_ppo.report_of_run = recorder, report
    try:
        t0 = time.time()
        summary = train_ppo.main(cfg)
        seconds = time.time() - t0
    finally:
        train_ppo.RolloutRecorder, train_ppo.report_of_run = real_recorder, real_report

    def size(name):
        path = os.path.join(cfg.out_dir, name)
        return os.path.getsize(path) if os.path.exists(path) else 0
    return {"seconds": round(seconds, 2), "record_seconds": round(recorders[0].seconds, 3),
            "report_seconds": round(report_seconds[0], 3),
            "rollouts_bytes": size("rollouts.jsonl"), "report_bytes": size("report.html"),
            "gold": summary.get("gold"), "kl": summary.get("kl")}


def screenshot(page: str, png: str) -> None:
    """A picture of the top of `page` (an HTML file) as headless chromium draws it."""
    browser = shutil.which("chromium")
    if browser is None:
        print("no chromium: no picture of the report")
        return
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,1640", f"--screenshot={png}", "file://" + os.path.abspath(page)],
                   check=True, capture_output=True, timeout=120)
    print(f"wrote {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algos", nargs="+", default=["ppo"], choices=["ppo", "grpo", "rloo"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the machine's 2 cores)")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_report_cost"))
    ap.add_argument("--rerun", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["MINGPT_RLHF_PLOT"] = "0"  # curves.png is not what is measured
    sft, rm = os.path.join(args.work, "sft"), os.path.join(args.work, "rm")
    if not os.path.exists(os.path.join(sft, "ckpt.pt")):
        train_sft.main(train_sft.Config(out_dir=sft))
    if not os.path.exists(os.path.join(rm, "ckpt.pt")):
        train_rm.main(train_rm.Config(out_dir=rm, sft_dir=sft))
    result = results_file.load(RESULTS)
    result.update(torch=torch.__version__, threads=args.threads)
    for round_ in range(args.rounds):
        for algo in args.algos:
            order = (8, 0) if round_ % 2 == 0 else (0, 8)  # alternate which runs first
            for count in order:
                name = f"{algo}_record{count}_round{round_}"
                if name in result["runs"] and not args.rerun:
                    continue
                cfg = train_ppo.Config(out_dir=os.path.join(args.work, name, algo), sft_dir=sft,
                                       rm_dir=rm, algo=algo, record_rollouts=count)
                run = timed_run(cfg)
                run["date"] = datetime.date.today().isoformat()
                result["runs"][name] = run
                print(name, run, flush=True)
                results_file.save(RESULTS, result)
    summary = {}
    for algo in args.algos:
        on = [r for k, r in result["runs"].items() if k.startswith(f"{algo}_record8_")]
        off = [r for k, r in result["runs"].items() if k.startswith(f"{algo}_record0_")]
        if not on:
            continue
        share = [100 * r["record_seconds"] / r["seconds"] for r in on]
        summary[algo] = {
            "record_percent_of_run": [round(min(share), 3), round(max(share), 3)],
            "report_seconds": [min(r["report_seconds"] for r in on), max(r["report_seconds"] for r in on)],
            "rollouts_mb": round(max(r["rollouts_bytes"] for r in on) / 1e6, 3),
            "report_mb": round(max(r["report_bytes"] for r in on) / 1e6, 3),
            "seconds_with": [r["seconds"] for r in on], "seconds_without": [r["seconds"] for r in off]}
    result["summary"] = summary
    results_file.save(RESULTS, result)
    print(summary)
    run = os.path.join(args.work, "ppo_record8_round0", "ppo")
    if os.path.exists(os.path.join(run, "metrics.jsonl")):  # drawn again by today's run/report.py
        screenshot(write_report([run], os.path.join(args.work, "report.html")), PICTURE)


if __name__ == "__main__":
    main()
