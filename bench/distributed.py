"""The built-in pipeline in one process and under torchrun, timed, with the same global batches.

    python bench/distributed.py                    # 1 process (all threads), then 2 (1 thread each)
    python bench/distributed.py --nproc 1 2 4      # any list of process counts

For each count n: train_sft.py, train_rm.py and train_ppo.py with their defaults, started by
`torchrun --standalone --nproc_per_node n` (n = 1: plain `python`, as a user would). SFT and
RM take --batch_size per process, so under n processes they get batch_size / n to keep the
global batch (and so the result) of the single process; PPO's rollout and minibatch sizes are
global already. Writes bench/results/distributed.json: wall seconds per stage, PPO's final
held-out figures, and its gold on bench/pipeline.py's 3,200-response comparison, per process
count. `--compare_only` redoes the comparison from existing runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import train_rm  # noqa: E402
import train_sft  # noqa: E402


def launch(n: int, threads: int | None, script: str, *args) -> float:
    """Run `script` on n processes; returns the wall seconds."""
    env = {**os.environ, "MINGPT_RLHF_PLOT": "0"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = ([sys.executable, script] if n == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", script])
    start = time.time()
    subprocess.run(cmd + [str(a) for a in args], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return round(time.time() - start, 1)


def final_figures(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"final"' in line][-1]


def compare(run_root: str) -> dict:
    """PPO's figures on bench/pipeline.py's comparison (200 held-out prompts x 16 samples)."""
    from pipeline import comparison_prompts, held_out_figures, load_reward_model
    from mingpt_rlhf.tasks import get_task
    task = get_task("reviews", seed=1337)
    rm = load_reward_model(os.path.join(run_root, "rm"))
    return held_out_figures(os.path.join(run_root, "ppo"), rm, task, comparison_prompts(task, 16), 1,
                            1337, task.sft_examples("eval"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="process counts to run")
    ap.add_argument("--root", default="out/bench_distributed", help="folder for the runs")
    ap.add_argument("--compare_only", action="store_true",
                    help="only redo the 3,200-response comparison of the runs in --root")
    args = ap.parse_args()
    path = os.path.join(ROOT, "bench", "results", "distributed.json")
    if args.compare_only:
        with open(path) as f:
            results = json.load(f)
        for n in args.nproc:
            name = f"{n} process{'es' if n > 1 else ''}"
            results["runs"][name]["ppo_compared"] = compare(os.path.join(args.root, f"n{n}"))
            print(name, results["runs"][name]["ppo_compared"], flush=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        return
    results = {"cpus": os.cpu_count(), "runs": {}}
    for n in args.nproc:
        d = lambda stage: os.path.join(args.root, f"n{n}", stage)  # noqa: E731
        threads = None if n == 1 else max(1, (os.cpu_count() or n) // n)
        seconds = {
            "sft": launch(n, threads, "train_sft.py", "--out_dir", d("sft"),
                          "--batch_size", train_sft.Config().batch_size // n),
            "rm": launch(n, threads, "train_rm.py", "--out_dir", d("rm"), "--sft_dir", d("sft"),
                         "--batch_size", train_rm.Config().batch_size // n),
            "ppo": launch(n, threads, "train_ppo.py", "--out_dir", d("ppo"), "--sft_dir", d("sft"),
                          "--rm_dir", d("rm")),
        }
        seconds["pipeline"] = round(sum(seconds.values()), 1)
        ppo = final_figures(d("ppo"))
        results["runs"][f"{n} process{'es' if n > 1 else ''}"] = {
            "threads_per_process": threads or "all", "seconds": seconds,
            "ppo_final": {k: round(ppo[k], 4) for k in ("gold", "well_formed", "kl", "rm_score")},
            "rm_final_eval_acc": round(final_figures(d("rm"))["eval_acc"], 4),
            "ppo_compared": compare(os.path.join(args.root, f"n{n}"))}
        print(json.dumps(results["runs"]), flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
