"""Where GRPO's and Dr. GRPO's group advantages point, judged by the gold reward.

    python bench/group_signal.py                       # after bench/algorithms.py
    python bench/group_signal.py --policies sft ppo_s1337

The two differ only in GRPO's division by each group's reward std. For each policy (the SFT
checkpoint and the trained runs of bench/algorithms.py in --root), sample --groups held-out
prompts x k responses (k = 8, as in training), score them with the reward model (the RL
methods' reward) and the gold reward, and compute both advantages per response:
- gold_corr: Pearson correlation, over all responses, between the advantage and the gold
  advantage (gold minus its group's mean gold): how much of the update points the true way;
- tied_share: the share of the total |advantage| that falls on groups whose responses are all
  equally good by gold (every difference the RM sees there is its own error);
- tied_groups: the share of such groups.
RLOO's advantage is Dr. GRPO's times k / (k - 1), so it has Dr. GRPO's figures.
Writes bench/results/group_signal.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

import train_ppo  # noqa: E402
from mingpt_rlhf.methods.bestofn import best_of_n  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402
from mingpt_rlhf.methods.critic_free import group_advantages  # noqa: E402
from mingpt_rlhf.tasks import get_task  # noqa: E402
from pipeline import load_reward_model  # noqa: E402


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return (a @ b / (a.norm() * b.norm()).clamp_min(1e-12)).item()


def signal(scores: torch.Tensor, golds: torch.Tensor, k: int) -> dict:
    """GRPO's and Dr. GRPO's advantages of `scores` (groups of k side by side) against gold."""
    g = golds.view(-1, k)
    gold_adv = (g - g.mean(-1, keepdim=True)).reshape(-1)
    tied = (g.max(-1).values - g.min(-1).values < 1e-9).repeat_interleave(k)
    out = {"tied_groups": round(tied.float().mean().item(), 4)}
    for name, normalise in (("grpo", True), ("dr_grpo", False)):
        adv = group_advantages(scores, k, normalise_std=normalise)
        out[name] = {"gold_corr": round(pearson(adv, gold_adv), 4),
                     "tied_share": round((adv.abs() * tied).sum().item() / adv.abs().sum().item(), 4)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="out/bench", help="folder of bench/algorithms.py's runs")
    ap.add_argument("--policies", nargs="+",
                    default=["sft", "ppo_s1337", "grpo_std_kl_loss_s1337", "dr_grpo_kl_loss_s1337",
                             "rloo_s1337"])
    ap.add_argument("--groups", type=int, default=200, help="held-out prompts, k responses each")
    ap.add_argument("--group_size", type=int, default=train_ppo.Config().group_size)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    task = get_task("reviews", seed=args.seed)
    rm = load_reward_model(os.path.join(args.root, "rm"))
    k = args.group_size
    prompts = [p for p in task.prompts("eval")[:args.groups] for _ in range(k)]  # groups side by side
    rows = {}
    for name in args.policies:
        run_dir = os.path.join(args.root, name)
        if not os.path.exists(os.path.join(run_dir, "ckpt.pt")):
            print(f"skipping {name}: no {run_dir}/ckpt.pt")
            continue
        policy, tokenizer, _ = load_policy(run_dir)
        texts, scores, _ = best_of_n(policy, rm, tokenizer, prompts, 1, train_ppo.Config().max_new_tokens,
                                     generator=torch.Generator().manual_seed(args.seed))
        golds = torch.tensor([task.gold_reward(p, t) for p, t in zip(prompts, texts)])
        rows[name] = {"gold": round(golds.mean().item(), 4), **signal(scores.float(), golds, k)}
        print(name, json.dumps(rows[name]), flush=True)
    path = os.path.join(ROOT, "bench", "results", "group_signal.json")
    with open(path, "w") as f:
        json.dump({"groups": args.groups, "group_size": k, "policies": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
