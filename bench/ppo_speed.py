"""Seconds per PPO iteration at a fixed configuration, split into generate / score / learn.

The fixed configuration: a random-init GPT with vocab 64, n_layer 4, n_head 4,
n_embd 128, block 256, dropout 0; 64 prompts of 16 random tokens; responses of exactly 32
sampled tokens (no EOS, temperature 1, no top-k / top-p); reward = the fraction of response
tokens equal to token 5; 4 PPO epochs x 4 minibatches of 16. No ptx loss (there are no
demonstrations for a random model).

    python bench/ppo_speed.py                       # --critic shared (the fixed config)
    python bench/ppo_speed.py --critic separate
    python bench/ppo_speed.py --dtype bfloat16      # bf16 autocast on the CPU

Prints one JSON line (median seconds per iteration after a warm-up, and the median of each
phase) and writes it to bench/results/ppo_speed_<critic>_<dtype>.json. With it,
`learn_matmul_floor`: the seconds this machine needs for only the matrix multiplies of the
update's linear layers (forward and both backward products, same shapes, same dtype, nothing
else), timed on their own. No implementation of the update can be faster than that here.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mingpt_rlhf.heads import Critic, ScalarHead  # noqa: E402
from mingpt_rlhf.model import GPT, GPTConfig  # noqa: E402
from mingpt_rlhf.ppo import FixedKLController  # noqa: E402
from mingpt_rlhf.ppo_trainer import PPOTrainer, resolve_auto_options  # noqa: E402
from mingpt_rlhf.machinery.runtime import DTYPES, autocast  # noqa: E402
from train_ppo import Config  # noqa: E402


def learn_matmul_floor(config: GPTConfig, rows: int, steps: int, dtype, reps: int = 5):
    """(seconds, GFLOP) of the linear layers' matmuls of `steps` minibatch updates of `rows`
    tokens each: per Linear(n_in, n_out), y = x W^T, dx = dy W and dW = dy^T x."""
    C = config.n_embd
    shapes = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] * config.n_layer + [(C, config.vocab_size)]
    mats = [(torch.randn(rows, i, dtype=dtype), torch.randn(o, i, dtype=dtype),
             torch.randn(rows, o, dtype=dtype)) for i, o in shapes]
    flop = steps * sum(3 * 2 * rows * i * o for i, o in shapes)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(steps):
            for x, w, dy in mats:
                x @ w.t()   # forward
                dy @ w      # gradient of the input
                dy.t() @ x  # gradient of the weight
        times.append(time.perf_counter() - t)
    return statistics.median(times), flop / 1e9


def measure(critic: str = "shared", dtype: str = "float32", iters: int = 10, warmup: int = 2,
            floor: bool = True) -> dict:
    """Median seconds per iteration and per phase (and, with `floor`, the learn floor)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, block_size=256, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    actor = GPT(config)
    ref = copy.deepcopy(actor).eval().requires_grad_(False)
    critic_model = value_head = None
    if critic == "separate":
        critic_model = Critic(config)
    else:
        value_head = ScalarHead(config.n_embd)
    cfg = resolve_auto_options(Config(
        critic=critic, rollout_batch_size=64, ppo_epochs=4, minibatch_size=16, max_new_tokens=32,
        temperature=1.0, ptx_coef=0.0, target_kl=0.0))  # every update does all 4 x 4 minibatch steps

    def reward_fn(sequences, attention_mask, action_mask):
        responses = sequences[:, -action_mask.size(1):]
        return ((responses == 5).float() * action_mask).sum(-1) / action_mask.sum(-1)

    trainer = PPOTrainer(cfg, actor, ref, reward_fn, critic=critic_model, value_head=value_head,
                         eos_id=None, pad_id=0, kl_ctl=FixedKLController(cfg.kl_coef),
                         amp=lambda: autocast(torch.device("cpu"), DTYPES[dtype]),
                         dtype=DTYPES[dtype])
    g = torch.Generator().manual_seed(0)          # prompts and sampling
    shuffle = torch.Generator().manual_seed(1)    # minibatch order
    times = []
    for i in range(warmup + iters):
        prompts = torch.randint(0, 64, (64, 16), generator=g)
        t = time.time()
        exps, stats = trainer.step([(prompts, torch.ones_like(prompts))], g, shuffle)
        total = time.time() - t
        assert exps[0].action_mask.shape == (64, 32) and exps[0].action_mask.all()
        assert stats["minibatch_steps"] == 16
        if i >= warmup:
            times.append({"sec_per_iter": total, "t_generate": stats["t_generate"],
                          "t_score": stats["t_score"], "t_learn": stats["t_learn"]})
    result = {k: round(statistics.median(t[k] for t in times), 4) for k in times[0]}
    if floor:
        seconds, gflop = learn_matmul_floor(config, rows=cfg.minibatch_size * 48,
                                            # a separate critic is a second trunk to train
                                            steps=cfg.ppo_epochs * 64 // cfg.minibatch_size
                                            * (2 if critic == "separate" else 1),
                                            dtype=DTYPES[dtype])
        result.update(learn_matmul_floor=round(seconds, 4), learn_linear_gflop=round(gflop, 1),
                      floor_gflops_per_s=round(gflop / seconds, 1))
    result.update(critic=critic, dtype=dtype, iters=iters, torch=torch.__version__,
                  threads=torch.get_num_threads(), reward_last=round(stats["rm_score"], 4))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--critic", default="shared", choices=["shared", "separate"])
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--iters", type=int, default=10, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=2, help="iterations before measuring")
    args = ap.parse_args()
    result = measure(args.critic, args.dtype, args.iters, args.warmup)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", f"ppo_speed_{args.critic}_{args.dtype}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
