"""Which change keeps the duel game's GRPO learning? Each variant as a patch of one run.

    python bench/duel_variants.py --variant default --seed 0
    python bench/duel_variants.py --variant klloss --seed 1              # --kl_in loss
    python bench/duel_variants.py --variant fullkl_0.1+ent_0.01 --seed 1  # two at once
    python bench/duel_variants.py --table                               # the table from the JSON

The run is bench/duel_collapse.py's (its SFT policy in --work, then `train_ppo.py --env
examples/duel_env.py:Duel --algo grpo --max_new_tokens 3 --max_iters 300 --seed S` on one
thread, every other option at its default), with one or more variants joined by "+":
- default: nothing changed;
- klloss: the KL penalty in the loss (`--kl_in loss`, the k3 estimate) instead of the reward;
- ent_C: an entropy bonus, `--entropy_coef C`;
- eps_E: AdamW's epsilon E instead of 1e-8 (patched into the optimizer);
- beta2_B: AdamW's second-moment decay B instead of 0.95 (patched);
- revert_M: after each actor step, the minibatch's approx-KL to where the update started is
  measured again; past M x --target_kl the step is undone and the update ends (a trust region,
  patched: one more forward pass a step);
- fullkl_C: C x the exact KL(policy || reference) over the whole vocabulary at every action
  position added to the actor's loss (patched: one more reference pass a minibatch).
Each run's held-out win rate at every eval (200 episodes; step 0 is the SFT policy), its
largest `kl`, the share of tied groups over its last 20 iterations and the steps undone
(revert) go to bench/results/duel_variants.json as it ends, keyed algo/variant/seed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import results_file  # noqa: E402
import torch  # noqa: E402

import duel_collapse as d  # noqa: E402
import train_ppo  # noqa: E402
from mingpt_rlhf import optim, ppo_trainer  # noqa: E402
from mingpt_rlhf.run.metrics import read_metrics  # noqa: E402
from mingpt_rlhf.ppo import approx_kl  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "duel_variants.json")


def patch(variants: str) -> dict:
    """Apply each variant of `variants` ("a+b"); returns the options they set."""
    options = {}
    for variant in variants.split("+"):
        if variant.startswith("ent_"):
            options["entropy_coef"] = float(variant[4:])
        if variant == "klloss":
            options["kl_in"] = "loss"
        patch_one(variant)
    return options


def patch_full_kl(coef):
    """The exact KL(policy || reference) over the whole vocabulary at every action position,
    coef x its token mean added to the actor's loss (a prototype: one more reference forward)."""
    from mingpt_rlhf.ppo import masked_mean
    orig_pv = ppo_trainer.PPOTrainer.policy_and_values
    stash = {}

    def pv(self, sequences, attention_mask, T, entropy=None, with_values=True, ptx=None):
        out = orig_pv(self, sequences, attention_mask, T, entropy, with_values, ptx)
        if torch.is_grad_enabled() and not with_values:   # the learning pass
            hidden = self.actor.trunk(sequences, attention_mask)[:, T - 1:-1]
            logp = torch.log_softmax(self.actor.logits(hidden).float() / self.cfg.temperature, -1)
            with torch.no_grad():
                rh = self.ref.trunk(sequences, attention_mask)[:, T - 1:-1]
                ref = torch.log_softmax(self.ref.logits(rh).float() / self.cfg.temperature, -1)
            stash["kl"] = (logp.exp() * (logp - ref)).sum(-1)   # (B, N)
        return out
    orig_loss = ppo_trainer.actor_loss

    def loss(logprobs, entropy, old_logprobs, ref_logprobs, advantages, action_mask, *a, **k):
        l, figs = orig_loss(logprobs, entropy, old_logprobs, ref_logprobs, advantages, action_mask, *a, **k)
        if "kl" in stash:
            kl = masked_mean(stash.pop("kl"), action_mask)
            figs["full_kl"] = kl.detach()
            l = l + coef * kl
        return l, figs
    ppo_trainer.PPOTrainer.policy_and_values = pv
    ppo_trainer.actor_loss = loss


def patch_one(variant):
    """The patches of the optimizer and the trainer (module docstring)."""
    if variant.startswith("fullkl_"):
        patch_full_kl(float(variant[7:]))
    if variant.startswith("beta2_") or variant.startswith("eps_"):
        init = optim.Optimizer.__init__

        def new_init(self, *a, **k):
            init(self, *a, **k)
            for g in self.adamw.param_groups:
                if variant.startswith("beta2_"):
                    g["betas"] = (0.9, float(variant[6:]))
                else:
                    g["eps"] = float(variant[4:])
        optim.Optimizer.__init__ = new_init
    if variant.startswith("revert"):
        bound = float(variant.split("_")[1])  # x target_kl
        orig = ppo_trainer.PPOTrainer._learn_minibatch
        state = {"stopped": False, "reverts": 0}
        orig_learn = ppo_trainer.PPOTrainer.learn

        def learn(self, generator=None):
            state["stopped"] = False
            out = orig_learn(self, generator)
            out["reverts"] = state["reverts"]
            return out

        def lm(self, mb, generator=None):
            if state["stopped"]:
                return {"approx_kl": torch.zeros(()), "ptx_loss": torch.zeros(())}, False, 1.0
            params = ppo_trainer.trainable(self.actor)
            before = [p.detach().clone() for p in params]
            figures, stepped, kl = orig(self, mb, generator)
            if stepped:
                with torch.no_grad():
                    lp = self.policy_and_values(mb.sequences, mb.attention_mask, mb.prompt_len, with_values=False)[0]
                    moved = approx_kl(lp, mb.start_logprobs, mb.action_mask).item()
                if moved > bound * self.cfg.target_kl:
                    with torch.no_grad():
                        for p, b in zip(params, before):
                            p.copy_(b)
                    state["reverts"] += 1
                    state["stopped"] = True
                    return figures, False, moved
            return figures, stepped, kl
        ppo_trainer.PPOTrainer._learn_minibatch = lm
        ppo_trainer.PPOTrainer.learn = learn


def run(variant: str, seed: int, algo: str, lr: float, iters: int, work: str) -> dict:
    extra = patch(variant)
    sft = d.run_sft(work)
    out = os.path.join(work, "variants", f"{algo}_{variant}_lr{lr:g}_s{seed}")
    start = time.time()
    train_ppo.main(train_ppo.Config(out_dir=out, sft_dir=sft, env=d.ENV, algo=algo, seed=seed,
                                    max_new_tokens=d.TURN_TOKENS, max_iters=iters, actor_lr=lr,
                                    **extra))
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    train = [r for r in rows if "pg_loss" in r]
    return {"variant": variant, "seed": seed, "algo": algo, "lr": lr,
            "seconds": round(time.time() - start),
            "evals": [(r["step"], r.get("win")) for r in rows if r.get("split") == "eval"],
            "max_kl": max(r["kl"] for r in train), "reverts": train[-1].get("reverts"),
            "zero_groups_last20": sum(r.get("zero_groups", 0) for r in train[-20:]) / 20}


def table(result: dict) -> None:
    for key, r in sorted(result["runs"].items()):
        wins = [w for _, w in r["evals"]]
        print(f"{key:34s} SFT {wins[0]:.3f} -> {wins[-1]:.3f} (best {max(wins):.3f}), "
              f"largest kl {r['max_kl']:.1f}, tied groups at the end {r['zero_groups_last20']:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="default", help="variants joined by + (module docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algo", default="grpo", choices=["grpo", "ppo", "rloo"])
    ap.add_argument("--lr", type=float, default=-1.0, help="--actor_lr (-1: the default for --env)")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_duel"))
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--table", action="store_true", help="only print the table of the JSON")
    args = ap.parse_args()
    result = results_file.load(args.results)
    if not args.table:
        torch.set_num_threads(1)
        r = run(args.variant, args.seed, args.algo, args.lr, args.iters, args.work)
        result = results_file.load(args.results)  # another run may have saved meanwhile
        result["runs"][f"{args.algo}/{args.variant}/{args.seed}"] = r
        results_file.save(args.results, result)
    table(result)


if __name__ == "__main__":
    main()
