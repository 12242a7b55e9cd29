"""Seconds per PPO iteration of trl 0.11.4's classic PPOTrainer, for comparison with ours
(bench/ppo_speed.py for --shape toy, bench/gpt2_scale.py's cpu batch for --shape gpt2).

One iteration = `ppo_trainer.generate(...)` on the rollout batch (one batched
`model.generate` call by default, see --gen_batch_size) + the reward (a plain torch function:
the fraction of response tokens equal to token 5) + `ppo_trainer.step(queries, responses,
rewards)` (trl's rollout forward passes of policy and reference, rewards with the KL penalty,
GAE, then ppo_epochs passes of minibatch updates). step() does not generate again.

Shapes (random init, float32, CPU, all dropouts 0, value head = trl's
AutoModelForCausalLMWithValueHead on the policy's trunk):
- toy:  GPT-2 architecture, vocab 64, 4 layers x 4 heads x 128, 256 positions; 64 prompts of
        16 tokens, exactly 32 new tokens; batch 64, minibatch 16, 4 PPO epochs;
- gpt2: GPT-2 small (12 x 12 x 768, vocab 50257, 1024 positions); 8 prompts of 64 tokens,
        exactly 32 new tokens; batch 8, minibatch 4, 1 PPO epoch.
Sampling: temperature 1, top_k 0, top_p 1, do_sample. No EOS: the EOS id is one past the
vocabulary, so every response is exactly 32 tokens. KL: fixed coefficient 0.05 (no adaptive
control), no early stopping, lr 5e-5, Adam (trl's default), no gradient clipping (trl's
default max_grad_norm=None; --max_grad_norm to set one).

--lora_rank R: a peft LoRA on the policy (r=R, alpha 32, c_attn,c_proj,c_fc), trl's way:
the PPOTrainer gets ref_model=None and the reference is the same model with its adapters
disabled.

    bench/peers/.venv/bin/python bench/peers/trl_ppo.py --shape toy
    bench/peers/.venv/bin/python bench/peers/trl_ppo.py --shape gpt2 --lora_rank 8

Prints one JSON line (medians over the measured iterations) and writes it to --json if given.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, emit, gpt2_model, offline_tokenizer, peak_rss_mb, versions  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

RUNS = {
    "toy": dict(prompts=64, prompt_len=16, new_tokens=32, batch_size=64, mini_batch_size=16,
                ppo_epochs=4, iters=5),
    "gpt2": dict(prompts=8, prompt_len=64, new_tokens=32, batch_size=8, mini_batch_size=4,
                 ppo_epochs=1, iters=3),
}
REWARD_TOKEN = 5


def reward_fn(responses: list[torch.Tensor]) -> list[torch.Tensor]:
    """One score per response: the fraction of its tokens equal to REWARD_TOKEN."""
    return [(r == REWARD_TOKEN).float().mean() for r in responses]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(RUNS), default="toy")
    ap.add_argument("--iters", type=int, default=None, help="measured iterations (default 5 toy, 3 gpt2)")
    ap.add_argument("--warmup", type=int, default=1, help="iterations before measuring")
    ap.add_argument("--lora_rank", type=int, default=0, help="peft LoRA rank on the policy (0 = full fine-tuning)")
    ap.add_argument("--lora_alpha", type=float, default=32.0)
    ap.add_argument("--gen_batch_size", type=int, default=0,
                    help="prompts per model.generate call inside ppo_trainer.generate "
                         "(0 = the whole rollout batch at once; trl's own default is 4)")
    ap.add_argument("--max_grad_norm", type=float, default=None,
                    help="trl's gradient clipping (default None = off, trl's default)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="transformers' GPT-2 attention (sdpa is what from_pretrained picks)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the JSON line to this file")
    args = ap.parse_args()
    run = RUNS[args.shape]
    iters = args.iters if args.iters is not None else run["iters"]
    if args.lora_rank and args.shape != "gpt2":
        print("note: --lora_rank is meant for --shape gpt2; running it on toy anyway", file=sys.stderr)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    warnings.filterwarnings("ignore", message=".*PPOTrainer` is deprecated.*")
    warnings.filterwarnings("ignore", message="No dataset is provided.*")
    warnings.filterwarnings("ignore", message=".*PPOConfig` is deprecated.*")

    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer, create_reference_model

    shape = SHAPES[args.shape]
    tokenizer = offline_tokenizer(shape["vocab_size"])
    base = gpt2_model(shape, args.attn)
    peft_config = None
    if args.lora_rank:
        from peft import LoraConfig
        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                 target_modules=["c_attn", "c_proj", "c_fc"], bias="none",
                                 fan_in_fan_out=True,  # GPT-2's Conv1D layers store W transposed
                                 task_type="CAUSAL_LM")
    # summary_dropout_prob: the value head's dropout (trl's default 0.1; all dropouts are 0 here)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base, peft_config=peft_config,
                                                              summary_dropout_prob=0.0)
    ref_model = None if args.lora_rank else create_reference_model(model)

    config = PPOConfig(
        exp_name="trl_ppo_bench", seed=args.seed, log_with=None,
        batch_size=run["batch_size"], mini_batch_size=run["mini_batch_size"],
        gradient_accumulation_steps=1, ppo_epochs=run["ppo_epochs"],
        learning_rate=5e-5, init_kl_coef=0.05, adap_kl_ctrl=False, kl_penalty="kl",
        early_stopping=False, max_grad_norm=args.max_grad_norm,
        # trl's defaults, spelled out: gamma 1, lam 0.95, cliprange 0.2 (value too), vf_coef 0.1
        gamma=1.0, lam=0.95, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
        whiten_rewards=False, use_score_scaling=False, use_score_norm=False, score_clip=None,
    )
    ppo_trainer = PPOTrainer(config, model, ref_model, tokenizer)
    torch.set_num_threads(args.threads)  # in case accelerate touched it

    gen_kwargs = dict(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, use_cache=True,
        max_new_tokens=run["new_tokens"],
        # == vocab_size, one past the last logit: never sampled, so no row stops early (no
        # min_new_tokens needed, and no logits processor masking it)
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gen_bs = args.gen_batch_size or run["prompts"]
    g = torch.Generator().manual_seed(args.seed)

    rows = []
    for i in range(args.warmup + iters):
        prompts = torch.randint(0, shape["vocab_size"], (run["prompts"], run["prompt_len"]), generator=g)
        queries = list(prompts)  # trl takes a list of 1-D tensors

        t0 = time.perf_counter()
        responses = ppo_trainer.generate(queries, batch_size=gen_bs, return_prompt=False, **gen_kwargs)
        t1 = time.perf_counter()
        rewards = reward_fn(responses)
        t2 = time.perf_counter()
        stats = ppo_trainer.step(queries, responses, rewards)
        t3 = time.perf_counter()

        lengths = {len(r) for r in responses}
        assert lengths == {run["new_tokens"]}, f"response lengths {lengths}"
        if i >= args.warmup:
            row = {"sec_per_iter": t3 - t0, "t_generate": t1 - t0, "t_reward": t2 - t1, "t_step": t3 - t2}
            row.update({k: float(v) for k, v in stats.items() if k.startswith("time/")})
            rows.append(row)

    med = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
    result = {
        "bench": "trl_ppo",
        "shape": args.shape + (f"+lora{args.lora_rank}" if args.lora_rank else ""),
        "sec_per_iter": med.pop("sec_per_iter"),
        "t_generate": med.pop("t_generate"),
        "t_step": med.pop("t_step"),
        "t_reward": med.pop("t_reward"),
        **med,  # trl's own time/ppo/* medians
        "sec_per_iter_all": [round(r["sec_per_iter"], 4) for r in rows],
        "peak_rss_mb": peak_rss_mb(),
        "iters": iters, "warmup": args.warmup,
        "prompts": run["prompts"], "prompt_len": run["prompt_len"], "new_tokens": run["new_tokens"],
        "batch_size": run["batch_size"], "mini_batch_size": run["mini_batch_size"],
        "ppo_epochs": run["ppo_epochs"], "gen_batch_size": gen_bs,
        "lora_rank": args.lora_rank, "attn": args.attn, "max_grad_norm": args.max_grad_norm,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "reward_last": round(float(stats["ppo/mean_scores"]), 4),
        "kl_last": round(float(stats["objective/kl"]), 4),
        "threads": torch.get_num_threads(),
        **versions(),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
