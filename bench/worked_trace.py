"""One PPO iteration on a tiny batch, every number printed: writes docs/worked_iteration.md.

    python bench/worked_trace.py            # (re)write the page
    python bench/worked_trace.py --check    # exit 1 if the page on disk is not what it would write

Every number on the page comes from the trainer's own code: `PPOTrainer.make_experience` rolls
the batch out, the functions of ppo.py and losses.py it calls are called again here one at a
time to show what each one returns, and `PPOTrainer._learn_minibatch` takes the two optimizer
steps. Nothing of PPO's math is written a second time to make the page; where a table breaks a
total into its tokens (the two branches of the clip), the script asserts that the tokens add up
to what the trainer's function returned. Independent checks (the rewards' sum, GAE by its
textbook sum, the trainer's own `learn` taking the same two steps) fail loudly if the page and
the code part ways. tests/test_worked_trace.py compares the page with what this script writes.

Tiny and deterministic: one thread, fixed seeds, a 1-layer GPT of width 8 over 12 tokens.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mingpt_rlhf.heads import ScalarHead  # noqa: E402
from mingpt_rlhf.losses import actor_loss, experience_advantages  # noqa: E402
from mingpt_rlhf.model import GPT, GPTConfig  # noqa: E402
from mingpt_rlhf.ppo import (FixedKLController, approx_kl, gae, kl_shaped_rewards,  # noqa: E402
                             masked_mean, masked_whiten, policy_loss, value_loss)
from mingpt_rlhf.ppo_trainer import PPOTrainer, resolve_auto_options  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "worked_iteration.md")
PAD, EOS, TARGET = 0, 1, 4
PROMPTS = [[3, 7, 2], [4, 9]]  # two prompts; the second is left-padded to the first's length
SEED, SAMPLE_SEED = 6, 2
NOISE = 0.3  # std of the noise that moves the actor away from the reference (see `build`)


def toy_reward(sequences, attention_mask, action_mask):
    """(B,) one point for every TARGET token in the response."""
    T = sequences.size(1) - action_mask.size(1)
    return ((sequences[:, T:] == TARGET) & action_mask.bool()).sum(-1).float()


def options():
    """train_ppo.py's defaults, but for the sizes of a tiny batch and a large learning rate."""
    from train_ppo import Config
    return resolve_auto_options(dataclasses.replace(
        Config(), max_new_tokens=4, minibatch_size=2, ppo_epochs=2, actor_lr=0.005,
        critic_lr=0.005, ptx_coef=0.0, target_kl=0.0, adaptive_kl=False))


def build(cfg):
    """The trainer: a reference GPT, an actor that is the reference plus noise (a policy that
    training has already moved, so the KL is not 0), a shared value head on the actor's trunk."""
    torch.manual_seed(SEED)
    ref = GPT(GPTConfig(vocab_size=12, block_size=12, n_layer=1, n_head=1, n_embd=8,
                        vocab_multiple=1)).requires_grad_(False)
    actor = copy.deepcopy(ref).requires_grad_(True)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(NOISE * torch.randn_like(p))
    head = ScalarHead(8)
    return PPOTrainer(cfg, actor, ref, toy_reward, value_head=head, eos_id=EOS, pad_id=PAD,
                      kl_ctl=FixedKLController(cfg.kl_coef))


def prompt_batch():
    T = max(len(p) for p in PROMPTS)
    ids = torch.full((len(PROMPTS), T), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, T - len(p):], mask[i, T - len(p):] = torch.tensor(p), 1
    return ids, mask


# ----------------------------------------------------------------------------- printing
def num(x: float, digits: int = 4) -> str:
    s = f"{x:.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s  # no "-0.0000"


def table(header: list[str], rows: list[list]) -> str:
    cells = [[c if isinstance(c, str) else num(c) for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


def per_token(name: str, x: torch.Tensor, mask: torch.Tensor, fmt=None) -> list:
    """One table row per response: `name (row b)` then each token's value, '' past the end."""
    fmt = fmt or num
    return [[f"{name}, row {b}"] + [fmt(float(x[b, t])) if mask[b, t] else ""
                                    for t in range(x.size(1))] for b in range(x.size(0))]


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"worked_trace: the page and the code disagree: {what}")


def close(a, b, atol=1e-5) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32),
                          torch.as_tensor(b, dtype=torch.float32), atol=atol, rtol=0)


# ----------------------------------------------------------------------------- the page
def page() -> str:
    """The page's text. One thread (the sums of a matrix product are then in a fixed order),
    set back as it was afterwards, so a test calling this leaves its process as it found it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return "\n".join(sections())
    finally:
        torch.set_num_threads(threads)


def sections() -> list[str]:
    cfg = options()
    trainer = build(cfg)
    cfg = trainer.cfg  # with its "auto" options resolved
    spec, beta = trainer.spec, trainer.kl_ctl.value
    out = []
    say = out.append

    say("# One PPO iteration, every number\n")
    say("This page walks one iteration of PPO over a batch of two prompts, with every "
        "intermediate number printed. It is written by `python bench/worked_trace.py` from the "
        "trainer's own functions (nothing here is computed by a copy of them), and "
        "tests/test_worked_trace.py fails if the page and the code disagree. The model is a "
        "1-layer GPT of width 8 over 12 token ids (0 is PAD, 1 is EOS); numbers are rounded "
        "to 4 decimals. Read it beside `ppo.py`, `losses.py` and `ppo_trainer.py`.\n")
    say("The setting: the options are train_ppo.py's defaults except for the sizes "
        f"(`max_new_tokens` {cfg.max_new_tokens}, `minibatch_size` {cfg.minibatch_size}, "
        f"`ppo_epochs` {cfg.ppo_epochs}), a learning rate of {cfg.actor_lr} for the actor and "
        f"its value head (large, so that one step moves some ratios past the clip), a fixed KL "
        f"coefficient beta = {beta}, no early stop on approx-KL and no ptx loss. The reference "
        f"is a random GPT; the actor is the reference with Gaussian noise of std {NOISE} added "
        "to every weight, standing in for a policy that training has already moved away from "
        "its SFT start, so the KL is not 0. The critic is a linear value head on the actor's "
        f"trunk (a shared critic). The reward is a toy: one point for every token {TARGET} in "
        "the response.\n")

    # ------------------------------------------------------------------ rollout
    ids, mask = prompt_batch()
    exp, stats = trainer.make_experience(ids, mask, torch.Generator().manual_seed(SAMPLE_SEED))
    T, am = exp.prompt_len, exp.action_mask
    B, N = am.shape
    cols = [f"t={t}" for t in range(N)]
    bool_fmt = lambda x: "1" if x else "0"  # noqa: E731

    say("## 1. Sampling\n")
    say("`PPOTrainer.make_experience` samples a response to each prompt from the actor. The "
        "prompts are left-padded so that every response starts in the same column; the "
        "response stops at EOS (1) or after `max_new_tokens`. The action mask is 1 on every "
        "token the policy chose, EOS included, and 0 on the padding after it: every sum and "
        "mean below runs over the tokens where it is 1.\n")
    rows = []
    for b in range(B):
        prompt = " ".join(str(int(x)) if mask[b, i] else "PAD" for i, x in enumerate(ids[b]))
        response = [str(int(exp.sequences[b, T + t])) if am[b, t] else "PAD" for t in range(N)]
        rows.append([f"row {b}", prompt] + response)
    say(table(["", "prompt"] + cols, rows) + "\n")
    say(table(["action mask"] + cols, per_token("mask", am, torch.ones_like(am), bool_fmt)) + "\n")

    say("## 2. Log-probs of the taken tokens\n")
    say("For each response token, its log-probability under the actor (the policy that "
        "sampled: these are the old log-probs the ratio will be taken against) and under the "
        "frozen reference. The logit that scores the token in column t comes from the position "
        "before it (`ppo_trainer.PPOTrainer.policy_and_values` takes the hidden states at "
        "T - 1 + t).\n")
    say(table(["log-prob"] + cols, per_token("actor", exp.logprobs, am)
              + per_token("reference", exp.ref_logprobs, am)) + "\n")

    # ------------------------------------------------------------------ rewards
    k1 = (exp.logprobs - exp.ref_logprobs) * am
    say("## 3. The KL penalty and the score\n")
    say("The per-token KL estimate is k1 = log pi(token) - log pi_ref(token): one sample of "
        "the KL between the actor and the reference at that position. A single token's k1 can be "
        "negative (the actor made that token rarer than the reference did); only its expectation "
        f"is the KL, which is >= 0. The KL coefficient beta is {beta}.\n")
    say(table(["k1"] + cols, per_token("k1", k1, am)) + "\n")
    raw = toy_reward(exp.sequences, exp.attention_mask, am)
    ended = ((exp.sequences[:, T:] == EOS) & am.bool()).any(-1)
    say("The reward function scores each whole response once. A response cut off by "
        "`max_new_tokens` without EOS gets `missing_eos_penalty` "
        f"({cfg.missing_eos_penalty}) instead of its score; the score is placed on the "
        "response's last real token, and every other token gets reward 0 from it.\n")
    say(table(["row", "toy reward", "ended with EOS", "score used", "on column"],
              [[f"row {b}", float(raw[b]), "yes" if ended[b] else "no", float(exp.scores[b]),
                str(int(am[b].nonzero()[-1]))] for b in range(B)]) + "\n")

    placed = torch.zeros_like(am)
    placed[torch.arange(B), am.long().cumsum(-1).argmax(-1)] = exp.scores
    rewards = kl_shaped_rewards(exp.scores, exp.logprobs, exp.ref_logprobs, am, beta)
    say("`ppo.kl_shaped_rewards` gives each token the reward r_t = -beta x k1_t, and adds the "
        "score to the last one. The KL is paid token by token, where it was spent, so the "
        "advantages can blame the tokens that spent it.\n")
    say(table(["reward"] + cols + ["sum"],
              [r + [num(float(rewards[b].sum()))] for b, r in enumerate(per_token("r", rewards, am))])
        + "\n")
    check(close(rewards, exp.rewards), "kl_shaped_rewards vs the experience's rewards")
    check(close(rewards.sum(-1), exp.scores - beta * k1.sum(-1)),
          "each row's rewards sum to its score - beta x its summed k1")

    # ------------------------------------------------------------------ GAE
    gamma, lam = spec.gamma, spec.lam
    values = exp.values
    say("## 4. Values and GAE\n")
    say("The critic's value V_t is its prediction, at the position before token t, of the "
        "rewards still to come in the response (here a linear head on the actor's last hidden "
        "state, untrained, so the values are small and arbitrary).\n")
    say(table(["value"] + cols, per_token("V", values, am)) + "\n")
    deltas, _ = gae(rewards, values, am, gamma, 0.0)  # lambda 0: A_t is delta_t itself
    advantages, returns = gae(rewards, values, am, gamma, lam)
    say(f"`ppo.gae` with gamma = {gamma} and lambda = {lam}. The one-step error is "
        "delta_t = r_t + gamma x V_(t+1) - V_t, with V = 0 after the last token (the response "
        "is over); these are `ppo.gae` with lambda 0, which returns delta_t as the advantage.\n")
    say(table(["delta"] + cols, per_token("delta", deltas, am)) + "\n")
    b = int(am.sum(-1).argmax())  # the longest response
    n = int(am[b].sum())
    say(f"Then a loop runs backwards over the tokens: A_t = delta_t + gamma x lambda x "
        f"A_(t+1), with A = 0 after the last token. For row {b}, from its last token back:\n")
    steps, next_adv = [], 0.0
    for t in reversed(range(n)):
        steps.append([str(t), float(rewards[b, t]), float(values[b, t]),
                      float(values[b, t + 1]) if t + 1 < n else 0.0, float(deltas[b, t]),
                      next_adv, float(advantages[b, t])])
        check(abs(float(deltas[b, t]) + gamma * lam * next_adv - float(advantages[b, t])) < 1e-5,
              f"gae's A_{t} = delta_{t} + gamma lambda A_{t + 1}")
        next_adv = float(advantages[b, t])
    say(table(["t", "r_t", "V_t", "V_(t+1)", "delta_t", "A_(t+1)", "A_t"], steps) + "\n")
    # GAE by its textbook sum: A_t = sum_l (gamma lambda)^l delta_(t+l)
    for r in range(B):
        m = int(am[r].sum())
        for t in range(m):
            direct = sum((gamma * lam) ** l * float(deltas[r, t + l]) for l in range(m - t))
            check(abs(direct - float(advantages[r, t])) < 1e-5, f"GAE's sum, row {r} token {t}")
    say("The returns, the critic's targets, are R_t = A_t + V_t (with lambda < 1 they are "
        "a mix of n-step returns, not the plain sum of the rewards to come).\n")
    say(table(["GAE"] + cols, per_token("A", advantages, am) + per_token("R", returns, am)) + "\n")

    whitened = masked_whiten(advantages, am)
    say("`ppo.masked_whiten` rescales the advantages over the batch's real tokens to mean 0 "
        "and standard deviation 1: (A - mean) / std. The policy loss sees these; the returns "
        "keep the raw ones.\n")
    say(table(["whitened A"] + cols, per_token("A", whitened, am)) + "\n")
    check(abs(float(masked_mean(whitened, am))) < 1e-5, "whitened advantages have mean 0")
    check(close(whitened, exp.advantages), "masked_whiten vs the experience's advantages")
    check(close(returns, exp.returns), "gae's returns vs the experience's returns")
    same = experience_advantages(placed, exp.logprobs, exp.ref_logprobs, values, am, spec, beta)
    check(all(close(a, b) for a, b in zip(same, (exp.rewards, exp.advantages, exp.returns))),
          "losses.experience_advantages (the trainer's one call) vs the steps above")

    # ------------------------------------------------------------------ learn
    say("## 5. Learning: the first minibatch step\n")
    say(f"The replay buffer holds the {B} rows; with `minibatch_size` {cfg.minibatch_size} "
        f"each epoch is one minibatch of the whole batch, and `ppo_epochs` {cfg.ppo_epochs} "
        "makes two optimizer steps on it. The first step's forward pass runs the same weights "
        "that sampled, so the new log-probs equal the old ones (to float rounding), the ratio "
        "is 1 on every token and nothing is clipped: PPO's first sanity check. The policy loss "
        "is then minus the mean whitened advantage, which is 0, but its gradient is not: it "
        "raises the log-prob of every token with a positive advantage and lowers the others.\n")
    twin = build(options())  # the same start, for the check against `learn` at the end
    shown = []
    for epoch in range(cfg.ppo_epochs):
        if epoch == 1:
            say("## 6. The second minibatch step: ratio and clip\n")
            say("The same minibatch again, after the step. The ratio is "
                "pi_new(token) / pi_old(token) = exp(new log-prob - old log-prob).\n")
        before = [p.detach().clone() for p in trainer.actor_opt.params]
        with torch.no_grad():
            new_lp, entropy, new_v = trainer.policy_and_values(
                exp.sequences, exp.attention_mask, T, "value")
            loss, figures = actor_loss(new_lp, entropy, exp.logprobs, exp.ref_logprobs,
                                       exp.advantages, am, spec, beta, trainer.budget, None,
                                       exp.start_logprobs)
            vf = value_loss(new_v, exp.values, exp.returns, am, cfg.clip_range_value)
        ratio = torch.exp(new_lp - exp.logprobs) * am
        eps = spec.clip_range
        # the two branches inside ppo.policy_loss, token by token (their mean is checked below)
        unclipped = -exp.advantages * ratio
        clipped = -exp.advantages * ratio.clamp(1 - eps, 1 + spec.clip_high)
        taken = torch.max(unclipped, clipped)
        check(close(masked_mean(taken, am), figures["pg_loss"]),
              "the per-token surrogates' mean vs ppo.policy_loss")
        check(close(masked_mean((clipped > unclipped).float(), am), figures["clipfrac"]),
              "the clipped tokens vs ppo.policy_loss's clipfrac")
        if epoch == 0:
            check(close(ratio, am), "the first minibatch's ratio is 1")
            say(table(["first step"] + cols, per_token("new log-prob", new_lp, am)
                      + per_token("ratio", ratio, am)) + "\n")
        else:
            say(table(["second step"] + cols, per_token("old log-prob", exp.logprobs, am)
                      + per_token("new log-prob", new_lp, am) + per_token("ratio", ratio, am))
                + "\n")
            say(f"`ppo.policy_loss` takes, per token, the larger (the more pessimistic) of the "
                f"unclipped surrogate -A x ratio and the clipped one "
                f"-A x clip(ratio, {1 - eps:.1f}, {1 + spec.clip_high:.1f}). Where the clipped "
                "one is larger, the ratio has already moved past the clip in the direction the "
                "advantage wants: that token's loss is flat in the ratio and it gets no "
                "gradient, so one minibatch cannot push a token's probability far. Where the "
                "ratio moved the other way, the unclipped term is the larger and still pulls "
                "it back.\n")
            say(table(["surrogate"] + cols,
                      per_token("A (whitened)", exp.advantages, am)
                      + per_token("-A x ratio", unclipped, am)
                      + per_token("-A x clip(ratio)", clipped, am)
                      + per_token("clipped (1 = yes)", (clipped > unclipped).float(), am, bool_fmt)
                      + per_token("loss", taken, am)) + "\n")
        say(f"The policy loss is the mean of the per-token loss over the {int(am.sum())} real "
            f"tokens: **{num(float(figures['pg_loss']))}**; clipfrac, the share of tokens "
            f"clipped, is {num(float(figures['clipfrac']))}.\n")
        vclipped = exp.values + (new_v - exp.values).clamp(-cfg.clip_range_value,
                                                           cfg.clip_range_value)
        say(f"`ppo.value_loss` is 0.5 x the mean over real tokens of the larger of "
            f"(V_new - R)^2 and (V_clip - R)^2, where V_clip is V_new kept within "
            f"{cfg.clip_range_value} of the old value. "
            + ("On the first step V_new is the old value, so the two are the same."
               if epoch == 0 else
               "The value head moved on the first step, so here the clip can matter.") + "\n")
        vrows = (per_token("R", exp.returns, am) + per_token("V_old", exp.values, am)
                 + per_token("V_new", new_v, am))
        if epoch:
            vrows += (per_token("V_clip", vclipped, am)
                      + per_token("0.5 (V_new - R)^2", 0.5 * (new_v - exp.returns) ** 2, am)
                      + per_token("0.5 (V_clip - R)^2", 0.5 * (vclipped - exp.returns) ** 2, am))
        say(table(["value loss"] + cols, vrows) + "\n")
        check(close(0.5 * masked_mean(torch.max((new_v - exp.returns) ** 2,
                                                (vclipped - exp.returns) ** 2), am), vf),
              "the per-token value losses' mean vs ppo.value_loss")
        k3 = torch.exp(new_lp - exp.start_logprobs) - 1 - (new_lp - exp.start_logprobs)
        check(close(masked_mean(k3, am), figures["approx_kl"]), "approx-KL's tokens vs ppo.approx_kl")
        check(close(approx_kl(new_lp, exp.start_logprobs, am), figures["approx_kl"]),
              "ppo.approx_kl vs losses.actor_loss's")
        say(f"The value loss is **{num(float(vf))}**, and the loss the shared trunk minimises "
            f"is policy loss + `vf_coef` ({cfg.vf_coef}) x value loss = "
            f"{num(float(loss + cfg.vf_coef * vf))}. `ppo.approx_kl` measures how far the update "
            "has moved the policy since it started, the mean over tokens of "
            "(ratio - 1) - log(ratio) (>= 0, and 0 only where the ratio is 1): "
            f"{num(float(figures['approx_kl']))}"
            + (" (0 to rounding on the first step)." if epoch == 0 else stop_note(figures)) + "\n")

        learned, stepped, _ = trainer._learn_minibatch(exp)  # the trainer's own step
        check(stepped, "the optimizer step was taken")
        for name, mine in [("pg_loss", figures["pg_loss"]), ("clipfrac", figures["clipfrac"]),
                           ("approx_kl", figures["approx_kl"]), ("vf_loss", vf)]:
            check(close(learned[name], mine), f"_learn_minibatch's {name} vs the page's")
        moved = [(p.detach() - q).abs() for p, q in zip(trainer.actor_opt.params, before)]
        biggest = max(float(m.max()) for m in moved)
        share = sum(int((m > 0.5 * cfg.actor_lr).sum()) for m in moved) / sum(m.numel() for m in moved)
        shown.append(float(figures["pg_loss"]))
        say(f"`PPOTrainer._learn_minibatch` then back-propagates that loss, clips the gradient's "
            f"norm to `grad_clip` ({cfg.grad_clip}) and takes one AdamW step. "
            + ("On AdamW's first step every weight with a nonzero gradient moves by about the "
               "learning rate, whatever its gradient's size (Adam divides the gradient by its "
               "own running magnitude): "
               if epoch == 0 else "On the second step: ")
            + f"the largest change of a weight is {num(biggest)}, and "
            f"{round(100 * share)} % of the weights moved by more than half the learning rate.\n")

    # the trainer's own learn(): the same two steps from the same start give the same weights
    twin_exp, _ = twin.make_experience(ids, mask, torch.Generator().manual_seed(SAMPLE_SEED))
    twin.buffer.add(twin_exp)
    twin.learn(torch.Generator().manual_seed(3))  # (its two draws keep the rows in order)
    check(all(close(p, q) for p, q in zip(trainer.actor_opt.params, twin.actor_opt.params)),
          "PPOTrainer.learn takes the two steps shown here")

    say("## 7. After the update\n")
    say("`PPOTrainer.learn` runs exactly these two steps (the script checks that it ends at the "
        "same weights), then clears the replay buffer: PPO is on-policy, so the next iteration "
        "samples a fresh batch with the new actor. With `adaptive_kl` (the default) beta would "
        "now move towards `kl_target`, reading the batch's KL: the mean over responses of "
        f"each response's summed k1, here {num(float(stats['kl']))} (the rows' sums are "
        + " and ".join(num(float(x)) for x in k1.sum(-1))
        + ": one response's can be negative, only the expectation cannot). This page keeps beta "
        "fixed.\n")
    check(close(k1.sum(-1).mean(), stats["kl"]), "the batch's KL vs make_experience's figure")
    return out


def stop_note(figures) -> str:
    """What the default early stop would have done with the second step's approx-KL."""
    from train_ppo import Config
    target, kl = Config().target_kl, float(figures["approx_kl"])
    if kl > target:
        return (f". The default `target_kl` ({target}) would have stopped the update here: the "
                "trainer compares a minibatch's approx-KL with it before stepping, and this one "
                "is past it, so the step would be discarded (this page turns the stop off to "
                "show the step).")
    return f", below the default `target_kl` ({target}): the update would go on."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/worked_iteration.md is not what this would write")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        with open(PAGE, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{PAGE} is out of date: run python bench/worked_trace.py")
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
