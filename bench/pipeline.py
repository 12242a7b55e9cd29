"""The built-in pipeline with default options, timed, and the comparisons the README quotes.

    python bench/pipeline.py                 # ~10 min on a 2-core CPU
    python bench/pipeline.py --skip_train    # only re-measure best-of-n from existing runs

1. train_sft.py, train_rm.py, train_ppo.py with their defaults (out dirs under --root),
   wall-clock seconds of each and their final figures.
2. train_ppo.py --kl_coef 0 --adaptive_kl false: what the KL penalty is for.
3. Best-of-n (n = 1, 4, 16) from the SFT policy with the same reward model, on the same
   held-out prompts as PPO's eval, with the generated tokens each costs per prompt.
Writes bench/results/pipeline.json and prints it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import train_ppo  # noqa: E402
import train_rm  # noqa: E402
import train_sft  # noqa: E402
from mingpt_rlhf.bestofn import best_of_n  # noqa: E402
from mingpt_rlhf.checkpoint import load_checkpoint, load_policy  # noqa: E402
from mingpt_rlhf.heads import RewardModel  # noqa: E402
from mingpt_rlhf.model import GPTConfig  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402


def timed(fn, cfg):
    t = time.time()
    summary = fn(cfg)
    return round(time.time() - t, 1), summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="out/bench", help="folder for the runs")
    ap.add_argument("--skip_train", action="store_true", help="reuse the runs in --root")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    r = lambda name: os.path.join(args.root, name)
    results = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if not args.skip_train:
        s_sft, sft = timed(train_sft.main, train_sft.Config(out_dir=r("sft"), seed=args.seed))
        s_rm, rm = timed(train_rm.main, train_rm.Config(out_dir=r("rm"), sft_dir=r("sft"), seed=args.seed))
        s_ppo, ppo = timed(train_ppo.main, train_ppo.Config(out_dir=r("ppo"), sft_dir=r("sft"),
                                                            rm_dir=r("rm"), seed=args.seed))
        s_nokl, nokl = timed(train_ppo.main, train_ppo.Config(
            out_dir=r("ppo_nokl"), sft_dir=r("sft"), rm_dir=r("rm"), seed=args.seed,
            kl_coef=0.0, adaptive_kl=False))
        results.update(
            seconds={"sft": s_sft, "rm": s_rm, "ppo": s_ppo, "pipeline": s_sft + s_rm + s_ppo,
                     "ppo_kl0": s_nokl},
            sft=sft, rm=rm, ppo=ppo, ppo_kl0=nokl)

    # best-of-n from the SFT policy, on PPO's held-out eval prompts, scored like PPO scores
    policy, tokenizer, _ = load_policy(r("sft"))
    rm_ckpt = load_checkpoint(os.path.join(r("rm"), "ckpt.pt"))
    rm = RewardModel(GPTConfig(**rm_ckpt["model_config"]))
    rm.load_state_dict(rm_ckpt["model"])
    rm.eval()
    ppo_cfg = train_ppo.Config()
    task = get_task("reviews", seed=args.seed)
    prompts = task.prompts("eval")[:ppo_cfg.eval_prompts]
    bon = {}
    for n in [1, 4, 16]:
        texts, scores, tokens = best_of_n(policy, rm, tokenizer, prompts, n, ppo_cfg.max_new_tokens,
                                          generator=torch.Generator().manual_seed(args.seed))
        gold = sum(task.gold_reward(p, t) for p, t in zip(prompts, texts)) / len(prompts)
        bon[f"best_of_{n}"] = {"gold": round(gold, 4), "rm_score": round(scores.mean().item(), 4),
                               "tokens_per_prompt": round(tokens, 1)}
    results["best_of_n"] = bon
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "pipeline.json")
    if args.skip_train and os.path.exists(path):
        with open(path) as f:
            results = {**json.load(f), **results}
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
