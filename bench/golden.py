"""Golden runs: nothing lost in a refactor, checked rather than hoped. A fixed set of tiny,
deterministic runs of the scripts, each written down exactly (its logs without the clock, a
hash of every tensor of its checkpoints), so that two revisions' records can be compared
key by key.

    python bench/golden.py --out /tmp/golden_a            # record every run into a folder
    python bench/golden.py --compare /tmp/golden_a /tmp/golden_b   # every run and key that differ
    python bench/golden.py --against main                 # record main (a git worktree) and the
                                                          # working tree, then compare: exit 1 if
                                                          # anything differs
    python bench/golden.py --against main --dir /tmp/g    # keep both records in /tmp/g
    python bench/golden.py --out /tmp/g --runs ppo grpo --jobs 2    # some runs, two at a time

Each run is a script started as a program with command-line flags (`python train_ppo.py
--algo grpo ...`, through a launcher that sets torch.set_num_threads(1) first), so options may
move between modules as long as their command-line names stay. The launcher runs in the
folder of the code under test and refuses to run if Python imports mingpt_rlhf from anywhere
else; `--against REV` checks out REV with `git worktree add` into a temporary folder and runs
there, then records the working tree, both on this machine, so the comparison does not depend
on the CPU's arithmetic. The runs' matplotlib curves are off (MINGPT_RLHF_PLOT=0); report.html
is not compared (the page embeds the logs that are).

What is recorded, per run, in DIR/NAME.json: the command (folders written as <work>), exit
status, and for every file the run wrote: each line of each *.jsonl (metrics.jsonl,
rollouts.jsonl) and each *.json (an ensemble's list), with the wall-clock keys removed (`time`,
`seconds`, `elapsed`, `t_*`, `*_time`, `*_seconds`, `*_per_s`); each ckpt.pt flattened to
{path: value}, every tensor as a SHA-256 of its dtype, shape and bytes (weights, optimizer
moments, RNG states), numbers and strings as they are, the elapsed time dropped; the final
summary (metrics.jsonl's last line, also under "summary"); and for sample.py the text it
prints. The comparison is exact: equal numbers, equal hashes.

The set (RUNS below): 46 runs, 48 processes, at tiny size (a 1-layer, 16-wide GPT, 2-3
iterations): the stages (SFT, the reward model, an ensemble of two, a held-out reward model
on other pairs, SFT on the guessing game, DPO), sample.py, and train_ppo.py's default and one
run per entry of its tables and options: --algo ppo|grpo|rloo|reinforce++|online_dpo,
--critic shared, --kl_in x --kl_estimator (all six), --grpo_norm grpo, --reduction
token|sequence|budget, --ratio sequence (GSPO), --clip_range_high, --overlong_buffer,
--dynamic_sampling, --learn_tokens top_entropy, --sampler_lag 2 with each --offpolicy
entry, --offpolicy under bfloat16, --learn_batch_size, --env guess, --lora_rank, --dtype
bfloat16, --ensemble_combine mean|wco|uwo|warm, --heldout_rm_dir, --record_rollouts 0, and --resume (a run stopped after 2
iterations and continued to 3, with and without a lagging sampler). A run takes 2-4 s of CPU
(half of it starting Python and torch), the set about 3 minutes of one core; --jobs 2 runs
two at a time (each on one thread, so the numbers do not change). Two records of the same
code are the same bit for bit; of the set, only --record_rollouts 0 and --heldout_rm_dir end
with the default's weights (they watch, they do not steer: their logs differ), and
--learn_batch_size logs the default's figures (its summed slices round apart in the last
bits of the weights).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# The tiny sizes every run shares: 1 layer, 16 wide; 2 iterations (3 for a lagging sampler),
# an eval and a checkpoint after each; 8 responses of up to 8 tokens per rollout. The RL runs
# learn at --actor_lr 3e-3, so that the policy moves within them: at the default 5e-5, k2 and
# k3 in the reward, --clip_range_high and the default, or tis, mask and decoupled ended with
# the same logs and weights bit for bit (the ratios and weights all stayed near 1), and a
# change to one of them would have gone unseen.
MODEL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "48"]
SMALL_EVAL = ["--eval_prompts", "8", "--max_new_tokens", "8"]
SFT = ["--batch_size", "8", "--max_iters", "6", "--eval_interval", "3", "--warmup_iters", "1"]
RM = ["--sft_dir", "{sft}", "--n_pairs", "48", "--batch_size", "8", "--eval_interval", "3",
      "--norm_samples", "8", "--max_new_tokens", "8"]
RL = ["--sft_dir", "{sft}", "--rm_dir", "{rm}", "--max_iters", "2", "--eval_interval", "1",
      "--rollout_batch_size", "8", "--minibatch_size", "4", "--ppo_epochs", "2", *SMALL_EVAL,
      "--actor_lr", "3e-3"]
LAG = ["--max_iters", "3", "--sampler_lag", "2"]


def ppo(*flags: str, rm: str = "rm", reads: tuple = ()) -> tuple:
    """A train_ppo.py run from the tiny SFT policy and `rm` (the folder of another run)."""
    return ("train_ppo.py", [f.replace("{rm}", "{%s}" % rm) for f in RL] + list(flags),
            ["sft", rm, *reads])


# name: (script, flags, the runs whose folders it reads ({name} in its flags))
RUNS = {
    # ---- the stages
    "sft": ("train_sft.py", [*MODEL, *SFT, *SMALL_EVAL], []),
    "rm": ("train_rm.py", RM, ["sft"]),
    "rm_ensemble": ("train_rm.py", [*RM, "--ensemble", "2"], ["sft"]),
    "rm_heldout": ("train_rm.py", [*RM, "--data_seed", "1"], ["sft"]),
    "sft_guess": ("train_sft.py", [*MODEL, *SFT, "--env", "guess", "--max_new_tokens", "3",
                                   "--eval_prompts", "8", "--max_turns", "4"], []),
    "dpo": ("train_dpo.py", ["--sft_dir", "{sft}", "--n_pairs", "48", "--batch_size", "8",
                             "--eval_interval", "3", "--warmup_iters", "1", "--rm_dir", "{rm}",
                             *SMALL_EVAL], ["sft", "rm"]),
    # ---- train_ppo.py: the default, then each algorithm
    "ppo": ppo(),
    "ppo_critic_shared": ppo("--critic", "shared"),
    "grpo": ppo("--algo", "grpo", "--group_size", "4"),
    "grpo_norm_grpo": ppo("--algo", "grpo", "--group_size", "4", "--grpo_norm", "grpo"),
    "rloo": ppo("--algo", "rloo", "--group_size", "4"),
    "reinforce++": ppo("--algo", "reinforce++"),
    "online_dpo": ppo("--algo", "online_dpo"),
    # the KL's estimators in each place (the default: k1 in the reward)
    "kl_reward_k2": ppo("--kl_in", "reward", "--kl_estimator", "k2"),
    "kl_reward_k3": ppo("--kl_in", "reward", "--kl_estimator", "k3"),
    "kl_loss_k1": ppo("--kl_in", "loss", "--kl_estimator", "k1"),
    "kl_loss_k2": ppo("--kl_in", "loss", "--kl_estimator", "k2"),
    "kl_loss_k3": ppo("--kl_in", "loss", "--kl_estimator", "k3"),
    # the reductions (ppo's default: token; grpo's: budget)
    "reduction_sequence": ppo("--reduction", "sequence"),
    "reduction_budget": ppo("--reduction", "budget"),
    "grpo_reduction_token": ppo("--algo", "grpo", "--group_size", "4", "--reduction", "token"),
    # the refinements
    "gspo": ppo("--algo", "grpo", "--group_size", "4", "--ratio", "sequence", "--clip_range", "3e-4"),
    "clip_range_high": ppo("--clip_range_high", "0.28"),
    "overlong_buffer": ppo("--overlong_buffer", "4"),
    "dynamic_sampling": ppo("--algo", "grpo", "--group_size", "4", "--dynamic_sampling", "2"),
    "top_entropy": ppo("--algo", "grpo", "--group_size", "4", "--learn_tokens", "top_entropy"),
    # a lagging sampler, with each off-policy correction
    "lag2_none": ppo(*LAG, "--offpolicy", "none"),
    "lag2_clip": ppo(*LAG, "--offpolicy", "clip"),
    "lag2_decoupled": ppo(*LAG, "--offpolicy", "decoupled"),
    # (a cap near 1: at 2, no weight reached it, and tis and mask were decoupled bit for bit)
    "lag2_tis": ppo(*LAG, "--offpolicy", "tis", "--tis_cap", "1.1"),
    "lag2_mask": ppo(*LAG, "--offpolicy", "mask", "--tis_cap", "1.1"),
    "lag2_gspo": ppo(*LAG, "--offpolicy", "gspo", "--algo", "grpo", "--group_size", "4"),
    "bf16_tis": ppo("--dtype", "bfloat16", "--offpolicy", "tis", "--tis_cap", "2"),
    # sizes, models, numerics
    "learn_batch_size": ppo("--learn_batch_size", "2"),
    "lora": ppo("--lora_rank", "4", "--lora_alpha", "8"),
    "bf16": ppo("--dtype", "bfloat16"),
    "env_guess": ("train_ppo.py", ["--sft_dir", "{sft_guess}", "--env", "guess", "--algo", "grpo",
                                   "--group_size", "4", "--max_turns", "4", "--max_new_tokens", "3",
                                   "--max_iters", "2", "--eval_interval", "1",
                                   "--rollout_batch_size", "8", "--minibatch_size", "4",
                                   "--ppo_epochs", "2", "--eval_prompts", "8", "--actor_lr", "3e-3"],
                  ["sft_guess"]),
    # rewards: an ensemble's combinations, a held-out reward model
    "ensemble_mean": ppo("--ensemble_combine", "mean", rm="rm_ensemble"),
    "ensemble_wco": ppo("--ensemble_combine", "wco", rm="rm_ensemble"),
    "ensemble_uwo": ppo("--ensemble_combine", "uwo", rm="rm_ensemble"),
    "ensemble_warm": ppo("--ensemble_combine", "warm", rm="rm_ensemble"),
    "heldout_rm": ppo("--heldout_rm_dir", "{rm_heldout}", reads=("rm_heldout",)),
    "record_rollouts_0": ppo("--record_rollouts", "0"),
    # stopped after 2 iterations, continued to 3 with --resume (in the same folder)
    "resume": ppo(),
    "resume_lag": ppo("--sampler_lag", "2", "--offpolicy", "tis", "--tis_cap", "2"),
    # ---- sample.py: what it prints is deterministic (a seeded generator)
    "sample": ("sample.py", ["--ckpt_dir", "{ppo}", "--compare", "{sft}", "--rm_dir", "{rm}",
                             "--prompt", "the plot was", "--num_samples", "2",
                             "--max_new_tokens", "8"], ["ppo", "sft", "rm"]),
}
# the runs continued with --resume after their first command, and the flags of the second
CONTINUED = {"resume": ["--max_iters", "3", "--resume"], "resume_lag": ["--max_iters", "3", "--resume"]}

# torch on one thread (sums in one order), and mingpt_rlhf imported from this folder only
LAUNCHER = """
import os, runpy, sys
import torch
torch.set_num_threads(1)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.getcwd())
import mingpt_rlhf
here = os.path.realpath(os.getcwd()) + os.sep
if not os.path.realpath(mingpt_rlhf.__file__).startswith(here):
    sys.exit(f"golden: mingpt_rlhf was imported from {mingpt_rlhf.__file__}, not from {here}")
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CLOCK = {"time", "seconds", "elapsed"}


def is_clock(key) -> bool:
    """A key whose value is wall-clock time, which no two runs share."""
    return isinstance(key, str) and (key in CLOCK or key.startswith("t_")
                                     or key.endswith(("_time", "_seconds", "_per_s")))


# ----------------------------------------------------------------------------- recording
def plain(value, work: str):
    """`value` (a parsed JSON line, or a part of one) without clock keys, its strings with
    the work folder written as <work>."""
    if isinstance(value, dict):
        return {k: plain(v, work) for k, v in value.items() if not is_clock(k)}
    if isinstance(value, list):
        return [plain(v, work) for v in value]
    if isinstance(value, str):
        return value.replace(work, "<work>")
    return value


def tensor_hash(t) -> str:
    """SHA-256 (its first 20 hex digits) of a tensor's dtype, shape and bytes."""
    import torch
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype} {tuple(t.shape)} ".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:20]


def flat_checkpoint(obj, work: str, path: str = "", out: dict | None = None) -> dict:
    """{path: value} of a checkpoint: tensors as hashes, numbers and strings as they are."""
    import torch
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[path] = tensor_hash(obj)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            if not is_clock(k):
                flat_checkpoint(obj[k], work, f"{path}.{k}" if path else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flat_checkpoint(v, work, f"{path}[{i}]", out)
    elif isinstance(obj, str):
        out[path] = obj.replace(work, "<work>")
    elif obj is None or isinstance(obj, (bool, int, float)):
        out[path] = obj
    else:
        out[path] = repr(obj).replace(work, "<work>")
    return out


def files_of_run(folder: str, work: str) -> dict:
    """Every file the run wrote that is compared: {relative path: its content as recorded}."""
    import torch
    files = {}
    for dirpath, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder)
            if name.endswith(".jsonl"):
                with open(path) as f:
                    files[rel] = [plain(json.loads(line), work) for line in f if line.strip()]
            elif name.endswith(".json"):
                with open(path) as f:
                    files[rel] = plain(json.load(f), work)
            elif name == "ckpt.pt":
                files[rel] = flat_checkpoint(torch.load(path, map_location="cpu", weights_only=False), work)
    return files


def run_one(name: str, code: str, work: str) -> dict:
    """Run `name` of RUNS with the scripts and package in folder `code`, its output folder in
    `work`; what it wrote, as recorded."""
    script, flags, _ = RUNS[name]
    folder = os.path.join(work, name)
    folders = {other: os.path.join(work, other) for other in RUNS}
    args = [f.format(**folders) for f in flags]
    if script != "sample.py":
        args += ["--out_dir", folder]
    commands = [args] + ([args + CONTINUED[name]] if name in CONTINUED else [])
    env = {**os.environ, "MINGPT_RLHF_PLOT": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONHASHSEED": "0"}
    record = {"name": name, "commands": [], "returncodes": []}
    stdout = []
    for command in commands:
        proc = subprocess.run([sys.executable, "-c", LAUNCHER, script, *command], cwd=code, env=env,
                              capture_output=True, text=True)
        record["commands"].append(" ".join([script, *command]).replace(work, "<work>"))
        record["returncodes"].append(proc.returncode)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip() and "%|" not in line]
            record["error"] = "\n".join(lines[-3:]).replace(work, "<work>")
            break
        stdout += proc.stdout.splitlines()
    if script == "sample.py":
        record["stdout"] = [line.replace(work, "<work>") for line in stdout]
    if os.path.isdir(folder):
        record["files"] = files_of_run(folder, work)
        metrics = record["files"].get("metrics.jsonl") or []
        if metrics and metrics[-1].get("final"):
            record["summary"] = metrics[-1]
    return record


def order(names: list[str]) -> list[list[str]]:
    """`names` and the runs they read, in waves: each wave's runs read only earlier waves'."""
    wanted, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in RUNS:
            raise SystemExit(f"no golden run named {name!r}; the runs: {', '.join(RUNS)}")
        if name not in wanted:
            wanted.add(name)
            stack += RUNS[name][2]
    waves, done = [], set()
    while len(done) < len(wanted):
        wave = [n for n in RUNS if n in wanted and n not in done and set(RUNS[n][2]) <= done]
        waves.append(wave)
        done |= set(wave)
    return waves


def record(code: str, out: str, names: list[str], jobs: int = 1, label: str = "") -> list[str]:
    """Run `names` (and what they read) with the code in folder `code`; write DIR/NAME.json
    into `out`. Returns the names of the runs that failed."""
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="golden_runs_")
    waves = order(names)
    total, done, failed, start = sum(len(w) for w in waves), 0, [], time.time()

    def timed(name):
        began = time.time()
        return run_one(name, code, work), time.time() - began
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for wave in waves:
                for name, (rec, seconds) in zip(wave, pool.map(timed, wave)):
                    done += 1
                    with open(os.path.join(out, f"{name}.json"), "w") as f:
                        json.dump(rec, f, indent=1, sort_keys=True)
                    status = "ok" if "error" not in rec else f"FAILED: {rec['error'].splitlines()[-1]}"
                    print(f"{label}[{done:2d}/{total}] {name:22s} {seconds:5.1f} s  {status}",
                          flush=True)
                    if "error" in rec:
                        failed.append(name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{label}recorded {total} runs into {out} in {time.time() - start:.0f} s", flush=True)
    return failed


# ----------------------------------------------------------------------------- comparing
def differences(a, b, path: str = "") -> list[str]:
    """Every place where `a` and `b` differ, as 'path: a != b' lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            where = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(f"{where}: only in the first")
            elif k not in a:
                out.append(f"{where}: only in the second")
            else:
                out += differences(a[k], b[k], where)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):  # a log's line says its step too
            step = f", step {x['step']}" if isinstance(x, dict) and "step" in x else ""
            out += differences(x, y, f"{path}[{i}{step}]")
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} entries != {len(b)}")
        return out
    if a != b or type(a) is not type(b):
        return [f"{path}: {short(a)} != {short(b)}"]
    return []


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def readable_order(rec: dict) -> dict:
    """A record with what a reader checks first first: the summary, the exit status, the
    logs, and the checkpoints' hashes last."""
    files = rec.get("files", {})
    rec = {k: rec[k] for k in ("summary", "returncodes", "error", "commands", "stdout") if k in rec}
    rec["files"] = {k: files[k] for k in sorted(files, key=lambda k: (k.endswith(".pt"),
                                                                     "metrics" not in k, k))}
    return rec


def compare(dir_a: str, dir_b: str, shown: int = 12) -> int:
    """Print every run and key that differ between two records; the number of runs that do."""
    names = sorted({f[:-5] for d in (dir_a, dir_b) for f in os.listdir(d) if f.endswith(".json")})
    differ = 0
    for name in names:
        paths = [os.path.join(d, f"{name}.json") for d in (dir_a, dir_b)]
        if not all(os.path.exists(p) for p in paths):
            differ += 1
            print(f"{name}: only in {dir_a if os.path.exists(paths[0]) else dir_b}")
            continue
        a, b = (readable_order(json.load(open(p))) for p in paths)
        lines = differences(a, b)
        if lines:
            differ += 1
            where = {}
            for line in lines:
                key = line.split(":")[0].split("[")[0]
                key = key[len("files."):] if key.startswith("files.") else key.split(".")[0]
                key = key.split(".pt.")[0] + ".pt" if ".pt." in key else key
                where[key] = where.get(key, 0) + 1
            print(f"{name}: {len(lines)} difference{'s' if len(lines) > 1 else ''} "
                  f"({', '.join(f'{k} {n}' for k, n in where.items())})")
            for line in lines[:shown]:
                print(f"    {line}")
            if len(lines) > shown:
                print(f"    ... and {len(lines) - shown} more")
        else:
            print(f"{name}: same")
    print(f"{len(names) - differ} of {len(names)} runs the same" + (f", {differ} differ" if differ else ""))
    return differ


def against(rev: str, out: str, names: list[str], jobs: int) -> int:
    """Record revision `rev` (a temporary git worktree) and the working tree; compare them."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True,
                            text=True)
    if commit.returncode:
        raise SystemExit(f"golden: no git revision {rev!r}")
    tree = tempfile.mkdtemp(prefix=f"golden_{commit.stdout.strip()}_")
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", tree, rev], cwd=ROOT, check=True)
    try:
        dir_rev, dir_here = os.path.join(out, commit.stdout.strip()), os.path.join(out, "working_tree")
        record(tree, dir_rev, names, jobs, label=f"{rev} ")
        failed = record(ROOT, dir_here, names, jobs, label="working tree ")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT)
    print(f"\ncomparing {rev} ({dir_rev}) with the working tree ({dir_here}):")
    return compare(dir_rev, dir_here) + len(failed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="DIR", help="record the runs of the working tree into DIR")
    mode.add_argument("--compare", nargs=2, metavar="DIR", help="compare two records")
    mode.add_argument("--against", metavar="REV", help="record REV and the working tree, compare")
    ap.add_argument("--runs", nargs="*", default=None, help="only these runs (and those they "
                                                            "read); default: all")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each on one thread)")
    ap.add_argument("--dir", default="", help="with --against: where to keep both records "
                                              "(default: a temporary folder)")
    args = ap.parse_args(argv)
    names = args.runs or list(RUNS)
    if args.compare:
        return 1 if compare(*args.compare) else 0
    if args.against:
        out = args.dir or tempfile.mkdtemp(prefix="golden_")
        return 1 if against(args.against, out, names, args.jobs) else 0
    failed = record(ROOT, args.out, names, args.jobs)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
