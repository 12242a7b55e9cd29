"""One GPU, once: what a short lease of a GPU measures and checks, in one command.

A GPU may be lent for a few minutes, with no network and its own torch. This script needs the
working tree and torch only (every model is random weights written here) and runs five parts
in this order, each writing OUT/gpu_<part>.json when it ends and after each of its rows, so
that a lease cut short still returns what finished first:

1. decode: the card (a bf16 matrix product's TFLOP/s and a copy's bandwidth, measured; the
   published peaks), then decoding at GPT-2 small's shape (random weights; 256-token prompts,
   64 new tokens, no EOS; float32 weights under bf16 autocast, as PPO samples) at 32 and 256
   rows, three ways: sampling.py's loop ("eager"), the fixed-shape step of
   decode_graphs.py run eagerly ("fixed") and replayed as CUDA graphs ("graph",
   train_ppo.py's --decode_graphs): one token's milliseconds ((time of 64 new tokens - time
   of 1) / 63), x its bound (the bytes a step must read: bf16 block weights, the float32
   output layer, the bf16 KV cache at its mean length, over the measured and the published
   bandwidth), the graphs' captures and their seconds. Then torch's profiler over 32 rows,
   eager and graph: the device's busy time and the launches per token (the difference of a
   64-token and a 1-token call, over 63), the kernels that take it, and the graph's
   milliseconds per token over that busy time (the target: 1.3x).
2. iterations: a PPO and a GRPO iteration (the second of two) at Qwen3-0.6B's shape (28
   layers x 1,024, grouped heads, SwiGLU, 151,669 ids; random weights in Qwen3's layout,
   bench/vs_peers.py's writer) in bf16, with full fine-tuning and with LoRA rank 16, at the
   recipe's batch (32 prompts of 256 tokens, 64 new, minibatches of 8): seconds per phase,
   peak memory, the decoding graphs' captures and their seconds.
3. mfu: SFT and RM steps at that shape (64 rows / 32 pairs of 256 + 64 tokens; SFT also with
   --tf32_output_layer) and their model-FLOPs utilisation: model FLOPs per step (`model_flops`)
   / seconds / the card's dense bf16 peak; then, if time is left, torch's profiler over SFT's.
4. tests: `pytest -m gpu` (the decoding graphs' and TF32's tests first, then tests/test_gpu.py).
5. pipeline: the built-in pipeline at its defaults (train_sft, train_rm, train_ppo; on CUDA
   bf16 and --decode_graphs), each stage's seconds, the eval figures, the captures.

Rows of parts 2 and 3 run one after another in this process (bench/gpt2_scale.py's worker);
parts 4 and 5 in processes of their own.

    PYTHONPATH=. python bench/gpu_once.py --out "$OUT"                       # all: ~9 min, H200
    PYTHONPATH=. python bench/gpu_once.py --parts tests pipeline --out "$OUT"
    python bench/gpu_once.py --device cpu --tiny --out /tmp/g                # the CPU dry run

`--budget` (seconds, default 540) bounds the whole run: a part or row that would not fit is
recorded as skipped, with what it needs. Then copy OUT/gpu_*.json and OUT/*_profile*.txt to
bench/results/.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpt2_scale  # noqa: E402

PARTS = ("decode", "iterations", "mfu", "tests", "pipeline")
# seconds a part needs at least to be worth starting on an H200 (a dry run needs less)
NEEDS = {"decode": 30, "iterations": 90, "mfu": 45, "tests": 60, "pipeline": 120}
# published dense (no sparsity) bf16 tensor-core peak, TFLOP/s, and memory bandwidth, TB/s
CARDS = {"H200": (989.4, 4.8), "H100 PCIe": (756.0, 2.0), "H100 NVL": (835.0, 3.9),
         "H100": (989.4, 3.35), "A100": (312.0, 2.0)}


class Run:
    """The arguments, the clock, and one JSON per part, written whole after each change."""

    def __init__(self, args):
        self.args, self.start = args, time.time()
        self.head = {"command": "PYTHONPATH=. python bench/gpu_once.py " + " ".join(sys.argv[1:]),
                     "date": time.strftime("%Y-%m-%d"), "revision": args.revision,
                     "device": args.device}
        self.parts: dict[str, dict] = {}
        self.card: dict = {}

    def left(self) -> float:
        return self.args.budget - (time.time() - self.start)

    def part(self, name: str) -> dict:
        self.parts[name] = {**self.head, "part": name, "card": self.card}
        return self.parts[name]

    def save(self, name: str, note: str = "") -> None:
        result = self.parts[name]
        result["seconds_so_far"] = round(time.time() - self.start, 1)
        path = os.path.join(self.args.out, f"gpu_{name}.json")
        with open(path + ".part", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".part", path)
        print(f"[{result['seconds_so_far']:.0f} s] {name}{': ' + note if note else ''}", flush=True)


def sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- model FLOPs
def shape_of(shape: str) -> dict:
    """A shape of gpt2_scale.SHAPES as the FLOP count reads it: layers, width, query and
    key/value heads, head width, the MLP (GELU 4 x width, or SwiGLU's own) and the vocabulary
    (the ids the output layer scores: the tokenizer's)."""
    s = gpt2_scale.SHAPES[shape]
    if s.get("family") == "qwen3":
        q = gpt2_scale.qwen3_shape(shape)
        return dict(L=q["n_layer"], C=q["n_embd"], heads=q["n_head"], kv_heads=q["n_kv_head"],
                    head_dim=q["head_dim"], mlp="swiglu", hidden=q["mlp"], vocab=q["tokens"])
    return dict(L=s["n_layer"], C=s["n_embd"], heads=s["n_head"], kv_heads=s["n_head"],
                head_dim=s["n_embd"] // s["n_head"], mlp="gelu", hidden=4 * s["n_embd"], vocab=50257)


def block_weights(m: dict) -> int:
    """The weights of the blocks' matrices: queries and the attention's output (heads x head
    width, by the width), keys and values (key/value heads x head width), the MLP's (GELU: in
    and out; SwiGLU: gate, up and down)."""
    q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    attention = 2 * m["C"] * q + 2 * m["C"] * kv
    mlp = (3 if m["mlp"] == "swiglu" else 2) * m["C"] * m["hidden"]
    return m["L"] * (attention + mlp)


def model_flops(stage: str, shape: str, batch: str) -> float:
    """Model FLOPs of one SFT or RM step (forward and backward): 6 per weight of the blocks'
    matrices per token; the attention's two products, 12 x layers x query heads x head width x
    sequence length per token (without the causal half, as PaLM's appendix counts them); and
    for SFT the output layer, 6 x vocabulary x width per response token (it is applied only
    where a token is scored, logprobs.py; the RM reads one scalar per sequence)."""
    m, b = shape_of(shape), gpt2_scale.BATCHES[batch]
    T = b["prompt"] + b["new"]
    rows = b["sft_batch"] if stage == "sft" else 2 * b["rm_batch"]
    blocks = (6 * block_weights(m) + 12 * m["L"] * m["heads"] * m["head_dim"] * T) * rows * T
    return blocks + (6 * m["vocab"] * m["C"] * rows * b["new"] if stage == "sft" else 0)


def row_name(stage, shape, batch, options) -> str:
    """e.g. sft_full_gpu, grpo_lora_recipe, sft_full_gpu_tf32."""
    name = f"{options.get('algo', stage)}_{'lora' if options.get('lora_rank') else 'full'}_{batch}"
    return name + ("_tf32" if options.get("tf32_output_layer") else "")


def add_utilisation(row: dict, card: dict) -> None:
    """Model FLOPs per second and their share of the card's peak, for full fine-tuning's SFT
    and RM rows (LoRA skips most weight gradients, so 6 per weight does not hold)."""
    if row["stage"] in ("sft", "rm") and not row.get("lora_rank") and "seconds" in row:
        flops = model_flops(row["stage"], row["shape"], row["batch"])
        row["model_tflop_per_step"] = round(flops / 1e12, 3)
        row["achieved_tflops"] = round(flops / row["seconds"] / 1e12, 1)
        if "peak_bf16_tflops" in card:
            row["mfu"] = round(flops / row["seconds"] / 1e12 / card["peak_bf16_tflops"], 3)


# ----------------------------------------------------------------------------- 1. decode
def the_card(args) -> dict:
    import torch
    dev = args.device
    card = {"torch": torch.__version__, "device": dev}
    n = 256 if args.tiny else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(dev)
    card["matmul_bf16_tflops"] = round(10 * 2 * n ** 3 / (time.perf_counter() - t) / 1e12, 3)
    x = torch.empty(2 ** (22 if args.tiny else 30), dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(dev)
    card["copy_tb_s"] = round(10 * 2 * x.numel() / (time.perf_counter() - t) / 1e12, 3)  # read + write
    if dev == "cuda":
        name = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        card.update(name=name, sms=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2 ** 30, 1))
        for key, (tflops, tbs) in CARDS.items():
            if key in name:
                card.update(peak_bf16_tflops=tflops, peak_tb_s=tbs, peak_source=f"published, {key}")
                break
    return card


def fastest(ones: list, alls: list) -> tuple:
    """The fastest of the one-token runs and of the whole runs. A busy machine only adds time,
    so the fastest of each is the nearest to its true time and the whole run, which does the
    one-token run's work and more, stays the longer unless every one-token run was slowed by
    more than the steps take."""
    return min(ones), min(alls)


def decode(run: Run) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from mingpt_rlhf.decode_graphs import BUCKET, DecodeGraphs
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.sampling import generate
    args, out = run.args, run.part("decode")
    run.card.update(the_card(args))
    run.save("decode", "the card")
    dev = torch.device(args.device)
    config = (GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=2, n_embd=64) if args.tiny
              else GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    torch.manual_seed(0)
    model = GPT(config).to(dev).eval()  # GPT-2 small's shape, random weights
    L, C, V = config.n_layer, config.n_embd, config.vocab_size
    prompt, new = (24, 10) if args.tiny else (256, 64)
    out.update(shape=dict(n_layer=L, n_embd=C, vocab=V), prompt=prompt, new=new,
               how="float32 weights under bf16 autocast; no EOS; top-k off")
    rows = out.setdefault("rows", {})

    def call(ids, n_new, loop, g):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            generate(model, ids, max_new_tokens=n_new, generator=g, loop=loop)

    def once(ids, n_new, loop, g):
        sync(args.device)
        t = time.perf_counter()
        call(ids, n_new, loop, g)
        sync(args.device)
        return time.perf_counter() - t

    def timed(ids, loop):
        """Seconds of the prompt pass and one token, and of the prompt pass and `new` tokens:
        each the fastest of 5 runs after a warm-up (and capture), the two taken in turn, so
        that a busy moment of the machine cannot make their difference, the steps, negative
        (a step from one run of each could be, at the dry run's milliseconds)."""
        g = torch.Generator(device=dev).manual_seed(0)
        once(ids, 1, None, g), once(ids, new, loop, g)
        ones, alls = [], []
        for _ in range(5):
            ones.append(once(ids, 1, None, g))
            alls.append(once(ids, new, loop, g))
        return fastest(ones, alls)
    for batch in ((4, 8) if args.tiny else (32, 256)):
        ids = torch.randint(0, V - 1, (batch, prompt), device=dev,
                            generator=torch.Generator(device=dev).manual_seed(batch))
        length = -(-(prompt + new) // BUCKET) * BUCKET
        weight_bytes = 2 * gpt2_scale_block_weights(L, C) + 4 * V * C
        kv_bytes = 2 * L * batch * (prompt + new / 2) * C * 2
        for mode in ("eager", "fixed", "graph"):
            name = f"{mode}_b{batch}"
            if run.left() < 15:
                rows[name] = {"skipped": "no time left"}
                continue
            loop = None if mode == "eager" else DecodeGraphs(capture=mode == "graph")
            t_one, t_all = timed(ids, loop)  # the prompt pass and one token: eager in every mode
            step = (t_all - t_one) / (new - 1)
            row = {"mode": mode, "batch": batch, "seconds_all": round(t_all, 4),
                   "seconds_prompt_pass": round(t_one, 4), "ms_per_step": round(1e3 * step, 3),
                   "tokens_per_s": round(batch / step, 1),
                   "bytes_per_step_mb": round((kv_bytes + weight_bytes) / 1e6, 1),
                   # the fixed step reads its whole buffer, not the filled part
                   "bytes_per_step_fixed_mb": round((2 * L * batch * length * C * 2 + weight_bytes) / 1e6, 1)}
            if mode == "graph":
                row["graphs"] = dev.type == "cuda"  # on a CPU: the fixed step, no graph
                row["captures"] = loop.captures
            for key, tbs in (("measured_copy", run.card.get("copy_tb_s")),
                             ("published", run.card.get("peak_tb_s"))):
                if tbs:
                    bound = (kv_bytes + weight_bytes) / (tbs * 1e12)
                    row[f"bound_ms_{key}"] = round(1e3 * bound, 4)
                    row[f"x_bound_{key}"] = round(step / bound, 2)
            rows[name] = row
            print(json.dumps({name: row}), flush=True)
            del loop
            free_memory(args.device)
            run.save("decode", name)
    # where a token's time goes: the profiler over 32 rows (4 in a dry run), eager and graph
    batch = 4 if args.tiny else 32
    ids = torch.randint(0, V - 1, (batch, prompt), device=dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    for mode in ("eager", "graph"):
        if run.left() < 15:
            out.setdefault("profile", {})[mode] = {"skipped": "no time left"}
            continue
        loop = DecodeGraphs() if mode == "graph" else None
        g = torch.Generator(device=dev).manual_seed(0)
        call(ids, new, loop, g)  # warm-up (and capture)
        sync(args.device)
        calls = {}
        for n_new in (1, new):
            with profile(activities=activities) as prof:
                call(ids, n_new, loop, g)
                sync(args.device)
            path = os.path.join(args.out, f"decode_profile_{mode}{'' if n_new > 1 else '_prompt'}.txt")
            calls[n_new] = gpt2_scale.profile_summary(prof, 1, path)
        per = lambda key: round((calls[new][key] - calls[1][key]) / (new - 1), 4)  # noqa: E731
        p = {"batch": batch, "device_busy_ms_per_token": per("device_busy_ms_per_step"),
             "kernel_launches_per_token": per("kernel_launches_per_step"),
             "graph_launches_per_token": per("graph_launches_per_step"),
             "host_syncs_per_token": per("host_syncs_per_step"), "top": calls[new]["top"]}
        timing = rows.get(f"{mode}_b{batch}", {})
        if p["device_busy_ms_per_token"] > 0 and "ms_per_step" in timing:
            p["ms_per_token_over_busy"] = round(timing["ms_per_step"] / p["device_busy_ms_per_token"], 2)
        out.setdefault("profile", {})[mode] = p
        print(json.dumps({f"profile_{mode}": {k: v for k, v in p.items() if k != "top"}}), flush=True)
        del loop
        free_memory(args.device)
        run.save("decode", f"profile {mode}")


def gpt2_scale_block_weights(L: int, C: int) -> int:
    """GPT-2's blocks' matrix weights (12 x width^2 a layer), for the decoding bound."""
    return block_weights(dict(L=L, C=C, heads=1, kv_heads=1, head_dim=C, mlp="gelu", hidden=4 * C))


# ----------------------------------------------------------------------------- 2, 3: rows
def measure_row(run: Run, part: str, name: str, spec: dict) -> dict:
    """gpt2_scale's worker on `spec` in this process, its output into OUT/<part>_rows.log; an
    exception is the row's "error"."""
    log = os.path.join(run.args.out, f"{part}_rows.log")
    t = time.time()
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        print(f"==== {name}: {json.dumps(spec)}", flush=True)
        try:
            row = gpt2_scale.worker(spec)
        except Exception:  # noqa: BLE001 (a row that fails is a result: the next row runs)
            text = traceback.format_exc()
            print(text, flush=True)
            row = {"error": text.strip().splitlines()[-1][:500]}
    free_memory(run.args.device)
    return {"wall_s": round(time.time() - t, 1), **row}


def qwen3_rows(run: Run, part: str, plan, needs: float) -> None:
    """Each (name, stage, batch, options, extra) of `plan` at Qwen3-0.6B's shape (the tiny
    Qwen3 in a dry run), into part's JSON as it ends."""
    args, out = run.args, run.part(part)
    shape = "qwen3_tiny" if args.tiny else "qwen3"
    folder = os.path.join(args.work, shape)
    t = time.time()
    for batch in sorted({p[2] for p in plan}):
        gpt2_scale.prepare(folder, shape, batch)  # once: weights, tokenizer, data
    out["fixture_s"] = round(time.time() - t, 1)
    out["shape"] = dict(name=shape, **shape_of(shape))
    rows = out.setdefault("rows", {})
    for name, stage, batch, options, extra in plan:
        if extra.get("cuda_only") and args.device != "cuda":
            rows[name] = {"skipped": "CUDA only"}
            continue
        if run.left() < needs:
            rows[name] = {"skipped": f"no time left (a row needs ~{needs:.0f} s)"}
            continue
        spec = dict(stage=stage, options=options, code=ROOT, folder=folder, batch=batch,
                    device=args.device, threads=0, mmap_threshold=0,
                    rm_dir=os.path.join(folder, "rm"),
                    **{k: v for k, v in extra.items() if k != "cuda_only"})
        if "profile" in spec:
            spec["profile"] = os.path.join(args.out, spec["profile"])
        row = {"stage": stage, "shape": shape, "batch": batch, **options,
               **measure_row(run, part, name, spec)}
        add_utilisation(row, run.card)
        rows[name] = row
        print(json.dumps({name: {k: v for k, v in row.items() if k != "profile"}}), flush=True)
        run.save(part, name)


def iterations(run: Run) -> None:
    batch = "tiny" if run.args.tiny else "recipe"
    bf16, lora = dict(dtype="bfloat16"), dict(dtype="bfloat16", lora_rank=16)
    grpo = dict(algo="grpo", **({"group_size": 4} if run.args.tiny else {}))
    plan = [(row_name("ppo", "", batch, o), "ppo", batch, o, {"iters": 1 if run.args.tiny else 2})
            for o in (bf16, lora, {**bf16, **grpo}, {**lora, **grpo})]
    qwen3_rows(run, "iterations", plan, needs=5 if run.args.tiny else 45)


def mfu(run: Run) -> None:
    batch = "tiny" if run.args.tiny else "gpu"
    bf16 = dict(dtype="bfloat16")
    tf32 = dict(bf16, tf32_output_layer=True)
    steps = 3 if run.args.tiny else 4  # the mean of steps 2 ... steps - 1
    plan = [(row_name("sft", "", batch, bf16), "sft", batch, bf16, {"steps": steps}),
            (row_name("sft", "", batch, tf32), "sft", batch, tf32, {"steps": steps, "cuda_only": True}),
            (row_name("rm", "", batch, bf16), "rm", batch, bf16, {"steps": steps}),
            ("sft_profile", "sft", batch, bf16, {"steps": steps + 2, "profile": "sft_profile.txt"})]
    qwen3_rows(run, "mfu", plan, needs=5 if run.args.tiny else 25)


# ----------------------------------------------------------------------------- 4, 5
def summary_lines(path: str, keep) -> list[str]:
    with open(path) as f:
        text = f.read().replace("\r", "\n")
    bar = re.compile(r"\d+/\d+ \[")  # tqdm's progress lines
    return [line for line in text.splitlines() if line.strip() and not bar.search(line) and keep(line)]


def tests(run: Run) -> None:
    out = run.part("tests")
    files = ["tests/test_decode_graphs.py", "tests/test_tf32_output_layer.py"]
    if not run.args.tiny:
        files.append("tests/test_gpu.py")
    log = os.path.join(run.args.out, "pytest_gpu.log")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    t = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", *files, "-q",
                                 "-p", "no:cacheprovider", "-rA"], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=max(10, run.left() - 10)).returncode
        except subprocess.TimeoutExpired:
            rc = "killed at the budget"
    out.update(files=files, rc=rc, wall_s=round(time.time() - t, 1),
               summary=summary_lines(log, lambda line: " passed" in line or " failed" in line
                                     or line.startswith(("FAILED", "ERROR", "SKIPPED")))[-30:],
               captures=summary_lines(log, lambda line: line.startswith("captures:")))
    run.save("tests", f"rc {rc}")


PIPELINE_TINY = {"sft": dict(max_iters=4, eval_interval=4, eval_prompts=4, batch_size=8,
                             n_layer=1, n_head=2, n_embd=16),
                 "rm": dict(n_pairs=32, eval_interval=4, norm_samples=8, batch_size=8),
                 "ppo": dict(max_iters=1, eval_interval=1, eval_prompts=4, rollout_batch_size=8,
                             minibatch_size=4)}


def pipeline_worker(spec: dict) -> dict:
    """The built-in pipeline in this process: train_sft, train_rm and train_ppo's mains at their
    defaults (spec["options"] per stage: a dry run's sizes), each stage timed; the PPO run's
    decoding graphs' captures. Returns one JSON-able dict."""
    import train_ppo
    import train_rm
    import train_sft
    from mingpt_rlhf.run.metrics import read_metrics
    from mingpt_rlhf.ppo_trainer import PPOTrainer
    root, device, opts = spec["root"], spec["device"], spec["options"]
    trainers, real_init = [], PPOTrainer.__init__

    def keep(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        trainers.append(self)
    PPOTrainer.__init__ = keep
    result = {}
    try:
        for stage, module, dirs in (("sft", train_sft, {}),
                                    ("rm", train_rm, {"sft_dir": f"{root}/sft"}),
                                    ("ppo", train_ppo, {"sft_dir": f"{root}/sft", "rm_dir": f"{root}/rm"})):
            t = time.time()
            graphs = {"decode_graphs": device == "cuda"} if stage == "ppo" else {}  # (off by default)
            module.main(module.Config(out_dir=f"{root}/{stage}", device=device, **dirs, **graphs,
                                      **opts.get(stage, {})))
            rows = read_metrics(f"{root}/{stage}/metrics.jsonl")
            evals = [r for r in rows if r.get("split") == "eval"]
            result[stage] = {"wall_s": round(time.time() - t, 1), "final": rows[-1],
                             "first_eval": evals[0] if evals else None}
    finally:
        PPOTrainer.__init__ = real_init
    loop = getattr(trainers[-1].generate, "keywords", {}).get("loop")
    result["ppo"]["decode_captures"] = loop.captures if loop is not None else None
    result["wall_s"] = round(sum(result[s]["wall_s"] for s in ("sft", "rm", "ppo")), 1)
    return result


def pipeline(run: Run) -> None:
    out = run.part("pipeline")
    root = os.path.join(run.args.work, "pipeline")
    spec = {"root": root, "device": run.args.device,
            "options": PIPELINE_TINY if run.args.tiny else {}}
    log = os.path.join(run.args.out, "pipeline.log")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", MINGPT_RLHF_PLOT="0")
    t = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--pipeline_worker",
                                 json.dumps(spec)], cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=max(10, run.left() - 5)).returncode
        except subprocess.TimeoutExpired:
            rc = "killed at the budget"
    out.update(rc=rc, wall_s=round(time.time() - t, 1), options=spec["options"] or "defaults")
    lines = summary_lines(log, lambda line: True)
    if rc == 0 and lines and lines[-1].startswith("{"):
        out.update(json.loads(lines[-1]))
    else:
        out["tail"] = lines[-30:]
    run.save("pipeline", f"rc {rc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS,
                    help="which parts, run in the order above (default: all)")
    ap.add_argument("--out", default="out/gpu_once", help="folder for the JSON, logs, profiles")
    ap.add_argument("--work", default="/tmp/gpu_once", help="folder for the fixtures and runs")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and batches: a dry run")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole run; what "
                    "would not fit is skipped and marked so")
    ap.add_argument("--revision", default="", help="the commit the working tree is at (a GPU "
                    "machine's copy may have no git history), recorded in each JSON")
    ap.add_argument("--pipeline_worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pipeline_worker:
        print(json.dumps(pipeline_worker(json.loads(args.pipeline_worker))))
        return
    if not args.revision:
        from results_file import measured
        args.revision = measured(ROOT)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    run = Run(args)
    for name in PARTS:
        if name not in args.parts:
            continue
        if run.left() < (5 if args.tiny else NEEDS[name]):
            run.part(name)["skipped"] = f"no time left (needs ~{NEEDS[name]} s)"
            run.save(name, "skipped")
            continue
        if not run.card and name != "decode":
            run.card.update(the_card(args))
        globals()[name](run)
    print(f"wrote {', '.join(f'gpu_{p}.json' for p in run.parts)} into {args.out} in "
          f"{time.time() - run.start:.0f} s")


if __name__ == "__main__":
    main()
