"""What moves the duel game's empty answer? Counterfactual optimizer steps, measured.

    python bench/duel_mechanism.py --seed 0 --iters 12 43     # ~3 min on one CPU thread

In examples/duel_env.py's game, GRPO at its defaults moves probability onto the empty answer
(EOS as an action's first token) at some turns, while the rollouts rarely or never sample it
there (bench/duel_collapse.py). This bench replays a run (the SFT policy of
bench/duel_collapse.py in --work, trained there if missing, at torch's default thread count;
then `train_ppo.py --env ...:Duel --algo grpo --max_new_tokens 3 --max_iters 300 --seed S`
on one thread) and, at every actor step of the iterations given, takes the step four ways
from the same weights, optimizer state and gradients, and measures the largest log p(EOS
first) over the minibatch's action starts after each:
- as_is: AdamW's step, as the run takes it;
- no_eos_row: the same, with EOS's row of the tied embedding / output layer left where it was;
- only_eos_row: only that row moved by the step;
- only_GROUP: only one group of parameters moved by AdamW's step (GROUPS: the embeddings, the
  attention layers, the MLPs, the layer norms, the final layer norm, the last block);
- eps_E: AdamW's step with epsilon E in its denominator instead of 1e-8;
- sgd_same_size: a plain gradient step whose update has the same L2 norm as AdamW's;
and, after the as_is step, what could have noticed it: the k3 approx-KL of the sampled tokens
(what the early stop reads, `approx_kl_sampled`) and the KL(before || after) over the whole
vocabulary at the same positions (`full_kl_mean`, `full_kl_max`); `eos_row_grad_share` is the
EOS row's share of the gradient's norm. The run then takes its real step and goes on. Writes
bench/results/duel_mechanism.json.

Measured on 2026-11-26 (seed 0, iterations 12 and 43, AMD EPYC 2-core machine, torch 2.13.0
CPU, revision d2b15a0's training code):
- The EOS row is not the cause: no_eos_row equals as_is to 0.01 nats at every step, and
  only_eos_row moves the log-prob by 0.02 at most.
- AdamW's direction is. In iteration 12 the empty answer's largest log-prob over the minibatch
  rises by up to 0.65 nats a step, from -11.7 to -7.3 in 9 steps, while a plain step of the
  same size moves it by 0.08 at most; in iteration 43 one step takes it from -3.5 to -0.07 (a
  3 % answer becomes a 93 % one), where the plain step takes it to -5.5.
- The trunk's matrices carry it, not the embeddings or the layer norms: at that step, only the
  attention layers' part of the step takes it to -0.42 and only the MLPs' to -2.16, while the
  embeddings' (-3.22) and the layer norms' (-3.51) leave it; in iteration 12 the attention
  and MLP parts each give about half of the rise.
- A larger epsilon does not stop it: 1e-6 and 1e-5 leave the jump (-0.07, -0.12), 1e-4 halves
  it (-0.96, still a 38 % answer).
- The early stop sees it only after the step: the sampled tokens' approx-KL after the jump is
  0.21 (the stop's threshold: 0.02), the whole vocabulary's KL 0.25 on average over the
  minibatch's tokens and 5.0 at the worst one.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

import duel_collapse as d  # noqa: E402
import train_ppo  # noqa: E402
from mingpt_rlhf import optim, ppo_trainer  # noqa: E402
from mingpt_rlhf.stages import load_policy  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "duel_mechanism.json")
# groups of the actor's parameters, by name: the counterfactual "only_<group>" moves only them
GROUPS = {
    "embeddings": lambda n: ".wte." in n or ".wpe." in n,
    "attention": lambda n: ".attn." in n,
    "mlp": lambda n: ".mlp." in n,
    "layernorms": lambda n: ".ln_" in n,
    "final_layernorm": lambda n: ".ln_f." in n,
    "last_block": lambda n: n.startswith("transformer.h.") and n.split(".")[2] == LAST_BLOCK[0],
}
LAST_BLOCK = ["3"]  # set from the model's n_layer


def probe(seed: int, probe_iters: set, work: str) -> list:
    """Replay seed `seed` to the last of `probe_iters`; the four steps of each actor step of
    those iterations (module docstring)."""
    stop_at = max(probe_iters)
    sft = d.run_sft(work)
    torch.set_num_threads(1)
    _, tok, _ = load_policy(sft, flag="--sft_dir")
    EOS = tok.eos_id
    state = {"it": 0, "mb": None, "trainer": None}
    out = []

    @torch.no_grad()
    def empty_max(actor, mb):
        T = mb.prompt_len
        hidden = actor.trunk(mb.sequences, mb.attention_mask)[:, T - 1:-1]
        lp = torch.log_softmax(actor.logits(hidden).float(), -1)[..., EOS]  # (B, N)
        am = mb.action_mask.bool()
        start = am & ~torch.cat([torch.zeros_like(am[:, :1]), am[:, :-1]], 1)
        return lp[start].max().item()

    @torch.no_grad()
    def all_logprobs(actor, mb):
        T = mb.prompt_len
        hidden = actor.trunk(mb.sequences, mb.attention_mask)[:, T - 1:-1]
        return torch.log_softmax(actor.logits(hidden).float(), -1)  # (B, N, V)

    @torch.no_grad()
    def kl_seen(actor, mb, old_logp):
        """After a step: the k3 approx-KL of the sampled tokens (what the early stop reads)
        and the KL(before || after) over the whole vocabulary at the same positions, as a mean
        over the action tokens and at the worst one."""
        new_logp = all_logprobs(actor, mb)
        am = mb.action_mask.bool()
        taken = mb.sequences[:, mb.prompt_len:]
        lr = (new_logp - old_logp).gather(-1, taken[..., None]).squeeze(-1)[am]
        full = (old_logp.exp() * (old_logp - new_logp)).sum(-1)[am]
        return {"approx_kl_sampled": (lr.exp() - 1 - lr).mean().item(),
                "full_kl_mean": full.mean().item(), "full_kl_max": full.max().item()}

    orig_step_opt = optim.Optimizer.step
    def opt_step(self):
        tr = state["trainer"]
        if tr is None or self is not tr.actor_opt or state["it"] not in probe_iters:
            return orig_step_opt(self)
        actor, mb = tr.actor, state["mb"]
        LAST_BLOCK[0] = str(actor.config.n_layer - 1)
        wte = actor.transformer.wte.weight
        before = empty_max(actor, mb)
        old_logp = all_logprobs(actor, mb)
        saved_p = [p.detach().clone() for p in self.params]
        saved_g = [None if p.grad is None else p.grad.clone() for p in self.params]
        saved_o = copy.deepcopy(self.adamw.state_dict())
        res = {"iter": state["it"], "before": before}
        def restore():
            with torch.no_grad():
                for p, s, g in zip(self.params, saved_p, saved_g):
                    p.copy_(s); p.grad = None if g is None else g.clone()
            self.adamw.load_state_dict(copy.deepcopy(saved_o))
        names = {id(p): n for n, p in actor.named_parameters()}
        for name in ("as_is", "no_eos_row", "only_eos_row"):
            restore()
            with torch.no_grad():
                if name == "no_eos_row":
                    p0 = wte.detach().clone()
            orig_step_opt(self)
            with torch.no_grad():
                if name == "no_eos_row":   # put the EOS row back where it was
                    wte[EOS] = p0[EOS]
                if name == "only_eos_row":  # every other parameter back
                    for p, s in zip(self.params, saved_p):
                        if p is wte:
                            keep = p[EOS].clone(); p.copy_(s); p[EOS] = keep
                        else:
                            p.copy_(s)
            res[name] = empty_max(actor, mb)
            if name == "as_is":  # what the early stop and a full-vocabulary KL see of the step
                res.update(kl_seen(actor, mb, old_logp))
        # AdamW's step on one group of parameters only (the rest put back)
        for group, members in GROUPS.items():
            restore()
            orig_step_opt(self)
            with torch.no_grad():
                for p, s in zip(self.params, saved_p):
                    if not members(names[id(p)]):
                        p.copy_(s)
            res["only_" + group] = empty_max(actor, mb)
        # the same step with a larger epsilon in AdamW's denominator
        for eps in (1e-6, 1e-5, 1e-4):
            restore()
            for g in self.adamw.param_groups:
                g["eps"] = eps
            orig_step_opt(self)
            for g in self.adamw.param_groups:
                g["eps"] = 1e-8
            res[f"eps_{eps:g}"] = empty_max(actor, mb)
        # (d) a plain gradient step, scaled to Adam's update norm
        restore()
        orig_step_opt(self)
        adam_delta = torch.sqrt(sum(((p.detach() - s) ** 2).sum() for p, s in zip(self.params, saved_p)))
        restore()
        with torch.no_grad():
            gnorm = torch.sqrt(sum((g ** 2).sum() for g in saved_g if g is not None))
            for p, g in zip(self.params, saved_g):
                if g is not None:
                    p -= g * (adam_delta / gnorm)
        res["sgd_same_size"] = empty_max(actor, mb)
        row_grad = next(g for p, g in zip(self.params, saved_g) if p is wte)[EOS]
        res["eos_row_grad_share"] = (row_grad.norm() / gnorm).item()
        restore()
        out.append(res)
        return orig_step_opt(self)   # the real step, as the run takes it

    orig_mb = ppo_trainer.PPOTrainer._learn_minibatch
    def probed(self, mb, generator=None):
        state["mb"], state["trainer"] = mb, self
        return orig_mb(self, mb, generator)
    orig_step = ppo_trainer.PPOTrainer.step
    class Stop(Exception): pass
    def step(self, *a, **k):
        state["it"] += 1
        if state["it"] > stop_at:
            raise Stop()
        return orig_step(self, *a, **k)
    optim.Optimizer.step = opt_step
    ppo_trainer.PPOTrainer._learn_minibatch = probed
    ppo_trainer.PPOTrainer.step = step
    try:
        train_ppo.main(train_ppo.Config(out_dir=os.path.join(work, f"mechanism_seed{seed}"),
                                        sft_dir=sft, env=d.ENV,
                                        algo="grpo", seed=seed, max_new_tokens=d.TURN_TOKENS,
                                        max_iters=300))
    except Stop:
        pass
    optim.Optimizer.step, ppo_trainer.PPOTrainer._learn_minibatch = orig_step_opt, orig_mb
    ppo_trainer.PPOTrainer.step = orig_step
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iters", type=int, nargs="+", default=[12, 43],
                    help="the iterations whose actor steps are taken four ways")
    ap.add_argument("--work", default=os.path.join(ROOT, "out", "bench_duel"))
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args()
    rows = probe(args.seed, set(args.iters), args.work)
    with open(args.results, "w") as f:
        json.dump({"seed": args.seed, "iters": args.iters, "steps": rows}, f, indent=1)
    for r in rows:
        print(" ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
