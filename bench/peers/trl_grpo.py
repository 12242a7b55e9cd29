"""Seconds and peak memory of one GRPO step of trl 1.x's GRPOTrainer (transformers 5), for
comparison with ours (`bench/vs_peers.py`'s grpo parts run `train_ppo.py --algo grpo` on the
same workload). Runs in its own venv: `bash bench/peers/trl1/setup.sh`.

The workload, the same on both sides: 8 prompts x a group of 4 samples = 32 responses per
step; prompts of exactly 64 tokens, responses of exactly 32 (the EOS id is one past the
vocabulary, so it is never sampled: every response is cut off at 32, checked every step);
temperature 1, no top-k / top-p; a trivial reward function (the fraction of a response's
token ids that are even: the groups' scores differ, so the advantages are not all 0); one
optimizer step per batch (`num_iterations=1`, the whole batch in one micro-batch, no gradient
accumulation).

Settings made equal to ours (the default; --trl_defaults leaves them to trl):
beta 0.04 (k3 in the loss, against a reference model), `loss_type="grpo"` (each response's
token mean, then the mean over responses), `scale_rewards="group"` (group mean and std),
epsilon 0.2, gradient clipping 1.0, AdamW (fused, betas 0.9 / 0.95 as ours, no weight decay),
lr 5e-5 decayed linearly, dropout off, no gradient checkpointing, float32 or bfloat16
(--dtype: `bf16=True`, trl's autocast with float32 weights, as ours). What still differs is
listed in docs/speed.md ("Against trl 1.x's GRPOTrainer").

--trl_defaults: the knobs a user would leave untouched take trl's own defaults (read from
GRPOConfig: bf16 on, gradient checkpointing on, loss "dapo", beta 0 so no reference model,
lr 1e-6, dropout not disabled); the workload stays the one above. The JSON records them.

Shapes (GPT-2 architecture, GPT-2's vocabulary of 50,257 and 1,024 positions, dropouts 0):
- toy:  4 layers x 4 heads x 128;
- gpt2: GPT-2 small, 12 x 12 x 768;
- qwen3: Qwen3-0.6B's (28 x 1,024, vocabulary 151,936), qwen3_tiny a test's size of it; these
  two need --init_from (bench/vs_peers.py's `write_qwen3_fixture` writes the folder), and run
  at fewer prompts per step (--prompts) so that both sides fit in memory.
--init_from DIR loads the weights of a folder holding config.json + model.safetensors (what
bench/vs_peers.py writes, so that both sides load the same random weights); without it a
random-init GPT2LMHeadModel of --shape is saved to a temporary folder first, since trl builds
its reference model from the policy's path.

How the phases are timed: a TrainerCallback marks each optimizer step (on_step_begin to
on_step_end: the step's forward and backward, clipping, the AdamW step and the scheduler; the
dataloader's fetch and trl's logging lie outside). Inside it, GRPOTrainer's own methods are
wrapped in a subclass:
- generate = `_generate` (tokenizing the prompts, `model.generate`, decoding);
- score = `_generate_and_score_completions` less `_generate` (the reference model's pass,
  the reward function, the advantages);
- learn = the rest of the step (trl's loss forward and backward, clipping, AdamW).
Peak memory: the process's peak resident set (Linux VmHWM) at the end, loading included, as
bench/peers/trl_ppo.py and bench/vs_peers.py measure it.

    bench/peers/trl1/.venv/bin/python bench/peers/trl_grpo.py --shape toy --steps 3
    bench/peers/trl1/.venv/bin/python bench/peers/trl_grpo.py --shape gpt2 --dtype bfloat16
    bench/peers/trl1/.venv/bin/python bench/peers/trl_grpo.py --shape gpt2 --trl_defaults

Prints one JSON line (medians over the measured steps) and writes it to --json if given.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, emit, gpt2_config, offline_tokenizer, peak_rss_mb, versions  # noqa: E402

import torch  # noqa: E402

GRPO_SHAPES = {
    "toy": dict(vocab_size=50257, n_layer=4, n_head=4, n_embd=128, n_positions=1024),
    "gpt2": SHAPES["gpt2"],
    "qwen3": dict(model_type="qwen3", vocab_size=151936, num_hidden_layers=28,
                  num_attention_heads=16, hidden_size=1024),
    "qwen3_tiny": dict(model_type="qwen3", vocab_size=640, num_hidden_layers=2,
                       num_attention_heads=4, hidden_size=32),
}
SIZE_KEYS = {"gpt2": ("n_layer", "n_head", "n_embd"),
             "qwen3": ("num_hidden_layers", "num_attention_heads", "hidden_size")}
PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS = 8, 4, 64, 32
# what --trl_defaults leaves to trl, recorded from the resolved GRPOConfig
RECORDED = ("bf16", "gradient_checkpointing", "loss_type", "beta", "learning_rate",
            "disable_dropout", "max_grad_norm", "scale_rewards", "epsilon", "num_iterations",
            "use_bias_correction_kl", "mask_truncated_completions", "optim", "adam_beta2",
            "weight_decay", "lr_scheduler_type", "top_k", "top_p", "temperature")


def reward_fn(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """One score per response: the fraction of its token ids that are even."""
    return [sum(t % 2 == 0 for t in ids) / len(ids) for ids in completion_ids]


def random_checkpoint(shape: dict, folder: str) -> str:
    """A random-init GPT2LMHeadModel of `shape` (dropouts 0), saved with save_pretrained."""
    from transformers import GPT2LMHeadModel
    GPT2LMHeadModel(gpt2_config(shape)).save_pretrained(folder)
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(GRPO_SHAPES), default="toy")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                    help="float32 (bf16=False) or bfloat16 (bf16=True: autocast, float32 weights); "
                         "default float32; not with --trl_defaults, where trl's default decides")
    ap.add_argument("--trl_defaults", action="store_true",
                    help="leave bf16, gradient checkpointing, loss_type, beta, lr and dropout to trl")
    ap.add_argument("--init_from", default="",
                    help="folder with config.json + model.safetensors (default: random init of --shape)")
    ap.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step (x a group of 4)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="steps before measuring")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the JSON line to this file")
    args = ap.parse_args()
    if args.trl_defaults and args.dtype:
        ap.error("--dtype with --trl_defaults: trl's default (bf16) decides the precision there")
    if args.steps < 1 or args.warmup < 0 or args.prompts < 1:
        ap.error("--steps and --prompts must be >= 1 and --warmup >= 0")
    family = GRPO_SHAPES[args.shape].get("model_type", "gpt2")
    if family != "gpt2" and not args.init_from:
        ap.error(f"--shape {args.shape} needs --init_from (bench/vs_peers.py writes the folder)")
    dtype = args.dtype or "float32"
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    shape = GRPO_SHAPES[args.shape]
    if args.init_from:  # its config decides; it must be of --shape, the label in the JSON
        with open(os.path.join(args.init_from, "config.json")) as f:
            saved = json.load(f)
        layers, heads, width = SIZE_KEYS[family]
        if saved.get("model_type", "gpt2") != family or any(
                saved.get(k) != shape[k] for k in (layers, heads, width)):
            ap.error(f"--init_from {args.init_from} holds a {saved.get(layers)}-layer, "
                     f"{saved.get(width)}-wide model, not --shape {args.shape}'s")
        shape = {**shape, "vocab_size": saved["vocab_size"]}
    V = shape["vocab_size"]
    tokenizer = offline_tokenizer(V)
    # the random checkpoint and trl's output_dir (nothing is saved there); removed at exit
    work = tempfile.TemporaryDirectory(prefix="trl_grpo_")
    model_path = args.init_from or random_checkpoint(shape, os.path.join(work.name, "model"))

    total = args.warmup + args.steps
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, V, (args.prompts * total, PROMPT_LEN), generator=g)
    dataset = Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in ids.tolist()]})

    workload = dict(  # the same work per step in both modes
        per_device_train_batch_size=args.prompts * GROUP, num_generations=GROUP,
        gradient_accumulation_steps=1, num_iterations=1, max_completion_length=NEW_TOKENS,
        temperature=1.0, top_p=1.0, top_k=0, max_steps=total, num_train_epochs=1,
        use_cpu=True, seed=args.seed, report_to="none", save_strategy="no",
        logging_steps=10**6, disable_tqdm=True, dataloader_num_workers=0,
    )
    equal = {} if args.trl_defaults else dict(
        bf16=dtype == "bfloat16", gradient_checkpointing=False, loss_type="grpo", beta=0.04,
        scale_rewards="group", epsilon=0.2, learning_rate=5e-5, lr_scheduler_type="linear",
        max_grad_norm=1.0, adam_beta2=0.95, weight_decay=0.0, disable_dropout=True,
        mask_truncated_completions=False,
    )
    config = GRPOConfig(output_dir=os.path.join(work.name, "out"), **workload, **equal)

    phase = {"generate": 0.0, "generate_and_score": 0.0}
    rows = []

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            phase["generate"] += time.perf_counter() - start
            prompt_ids, completion_ids = out[0], out[1]
            lengths = {len(p) for p in prompt_ids}, {len(c) for c in completion_ids}
            assert lengths == ({PROMPT_LEN}, {NEW_TOKENS}), f"prompt / response lengths {lengths}"
            return out

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            phase["generate_and_score"] += time.perf_counter() - start
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            phase.update(generate=0.0, generate_and_score=0.0, start=time.perf_counter())

        def on_step_end(self, args_, state, control, **kwargs):
            step = time.perf_counter() - phase["start"]
            rows.append({"sec_per_iter": step, "t_generate": phase["generate"],
                         "t_score": phase["generate_and_score"] - phase["generate"],
                         "t_learn": step - phase["generate_and_score"], "peak": peak_rss_mb()})

    trainer = TimedGRPOTrainer(model=model_path, reward_funcs=reward_fn, args=config,
                               train_dataset=dataset, processing_class=tokenizer,
                               callbacks=[StepTimer()])
    torch.set_num_threads(args.threads)  # in case accelerate touched it
    trainer.train()
    assert len(rows) == total, f"{len(rows)} steps timed, {total} expected"

    measured = rows[args.warmup:]
    med = {k: round(statistics.median(r[k] for r in measured), 4) for k in measured[0] if k != "peak"}
    resolved = {k: getattr(config, k) for k in RECORDED}
    resolved = {k: (v.value if hasattr(v, "value") else v) for k, v in resolved.items()}
    result = {
        "bench": "trl_grpo",
        "shape": args.shape,
        "mode": "trl_defaults" if args.trl_defaults else "equal",
        "dtype": "bfloat16" if config.bf16 else "float32",
        **med,
        "sec_per_iter_all": [round(r["sec_per_iter"], 4) for r in measured],
        "peak_rss_mb_steps": rows[-1]["peak"],  # right after the last step
        "peak_rss_mb": peak_rss_mb(),  # at the end
        "steps": args.steps, "warmup": args.warmup,
        "prompts": args.prompts, "group": GROUP, "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
        "init_from": args.init_from,
        "ref_model": trainer.ref_model is not None,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "config": resolved,
        "threads": torch.get_num_threads(),
        **versions(),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }
    emit(result, args.json)
    work.cleanup()


if __name__ == "__main__":
    main()
