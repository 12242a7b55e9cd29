"""One PPO iteration on a tiny batch, every number printed: writes docs/worked_iteration.md.

    python bench/worked_trace.py            # (re)write the page
    python bench/worked_trace.py --check    # exit 1 if the page on disk is not what it would write

The iteration is `python train_ppo.py`'s default one: a separate critic started from the reward
model, InstructGPT's ptx loss, the adaptive KL controller and the early stop on approx-KL.
Every number on the page comes from the trainer's own code: `PPOTrainer.make_experience` rolls
the batch out, the functions of ppo.py and losses.py it calls are called again here one at a
time to show what each one returns, the replay buffer gives the minibatches and
`PPOTrainer._learn_minibatch` takes the steps (and stops), as `PPOTrainer.learn` would.
Nothing of PPO's math is written a second time to make the page; where a table breaks a total
into its tokens (the two branches of the clip, approx-KL's terms), the script asserts that the
tokens add up to what the trainer's function returned. Independent checks (the rewards' sum,
the two paths of `kl_shaped_rewards`, GAE by its textbook sum, the critic's first values
against the reward model's scores of each prefix, the ptx loss on the demonstrations alone, the
trainer's own `step` ending at the same weights and beta) fail loudly if the page and the code
part ways. tests/test_worked_trace.py compares the page with what this script writes.

Tiny and deterministic: one thread, fixed seeds, a 1-layer GPT of width 8 over 12 tokens.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mingpt_rlhf.data import IGNORE, SFTData  # noqa: E402
from mingpt_rlhf.heads import Critic, RewardModel  # noqa: E402
from mingpt_rlhf.logprobs import input_mask, lm_logprobs, lm_loss  # noqa: E402
from mingpt_rlhf.losses import KL_ESTIMATORS, actor_loss, experience_advantages  # noqa: E402
from mingpt_rlhf.model import GPT, GPTConfig, build_empty  # noqa: E402
from mingpt_rlhf.ppo import (AdaptiveKLController, approx_kl, gae, kl_shaped_rewards,  # noqa: E402
                             last_action_index, masked_mean, masked_whiten, value_loss)
from mingpt_rlhf.ppo_trainer import PPOTrainer, resolve_auto_options  # noqa: E402
from mingpt_rlhf.rewards import ModelReward  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "worked_iteration.md")
PAD, EOS = 0, 1
PROMPTS = [[3, 7, 2], [4, 9]]  # two prompts; the second is left-padded to the first's length
# the ptx loss's demonstrations (prompt, response), as a run's SFT data holds them
DEMOS = [("3 7 2", "4 4"), ("4 9", "4 2 4"), ("7 3", "5 4")]
SEED, SAMPLE_SEED = 6, 2
# orders the minibatches and draws the ptx batches; this one keeps the two rows in order in
# every epoch (checked), so that each minibatch's tables line up with the rollout's
SHUFFLE_SEED = 2
NOISE = 0.3  # std of the noise that moves the actor away from the reference (see `build`)
ACTOR_LR = 0.003  # the one option besides the sizes that is not the default (`options`)


class Digits:
    """The demonstrations' tokenizer: a text of token ids, "3 7 2" -> [3, 7, 2]."""
    pad_id, eos_id = PAD, EOS

    def encode(self, text: str) -> list[int]:
        return [int(x) for x in text.split()]


def defaults():
    from train_ppo import Config
    return resolve_auto_options(Config())


def options():
    """train_ppo.py's defaults, but for the sizes of a tiny batch and the actor's learning rate."""
    return dataclasses.replace(defaults(), rollout_batch_size=len(PROMPTS), max_new_tokens=4,
                               minibatch_size=2, actor_lr=ACTOR_LR)


def build(cfg):
    """The trainer as train_ppo.load_models and set_up build it, at a tiny size: a reference
    GPT, an actor that is the reference plus noise (a policy that training has already moved,
    so the KL is not 0), a random reward model that scores the responses and that the separate
    critic starts from, the demonstrations of the ptx loss and the adaptive KL controller."""
    torch.manual_seed(SEED)
    config = GPTConfig(vocab_size=12, block_size=12, n_layer=1, n_head=1, n_embd=8,
                       vocab_multiple=1)
    ref = GPT(config).requires_grad_(False)
    actor = copy.deepcopy(ref).requires_grad_(True)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(NOISE * torch.randn_like(p))
    rm = RewardModel(config).requires_grad_(False)
    critic = build_empty(lambda: Critic(config))  # as load_models: from the RM's weights
    critic.load_trunk_and_head(rm.state_dict(), "the reward model")
    kl_ctl = AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    ptx_data = SFTData(Digits(), DEMOS, config.block_size)
    return PPOTrainer(cfg, actor, ref, ModelReward(rm, cfg.minibatch_size), critic=critic,
                      eos_id=EOS, pad_id=PAD, kl_ctl=kl_ctl, ptx_data=ptx_data)


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


def bool_fmt(x) -> str:
    return "1" if x else "0"


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"worked_trace: the page and the code disagree: {what}")


def close(a, b, atol=1e-5) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32),
                          torch.as_tensor(b, dtype=torch.float32), atol=atol, rtol=0)


def moved(params, before, lr: float) -> str:
    """How far an AdamW step moved the weights: the largest change, and the share past lr / 2."""
    changes = [(p.detach() - q).abs() for p, q in zip(params, before)]
    biggest = max(float(c.max()) for c in changes)
    share = sum(int((c > 0.5 * lr).sum()) for c in changes) / sum(c.numel() for c in changes)
    return (f"the largest change of a weight is {num(biggest)}, and {round(100 * share)} % of "
            f"the weights moved by more than half the learning rate")


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


@dataclasses.dataclass
class Trace:
    """What the sections share: the trainer, the rollout and the page being written."""
    trainer: PPOTrainer
    exp: object = None
    stats: dict = None
    out: list = dataclasses.field(default_factory=list)

    def say(self, text: str) -> None:
        self.out.append(text)

    @property
    def cfg(self):
        return self.trainer.cfg

    @property
    def cols(self) -> list[str]:
        return [f"t={t}" for t in range(self.exp.action_mask.size(1))]


def sections() -> list[str]:
    trace = Trace(build(options()))
    introduction(trace)
    rollout(trace)
    learned = learning(trace)
    after_the_update(trace, learned)
    return trace.out


def introduction(trace: Trace) -> None:
    cfg, say = trace.cfg, trace.say
    base = defaults()
    changed = [f.name for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(base, f.name)]
    check(set(changed) == {"rollout_batch_size", "minibatch_size", "max_new_tokens", "actor_lr"},
        f"the options that differ from train_ppo.py's defaults are the sizes and actor_lr, "
        f"not {changed}")
    check(trainer_is_the_default(trace.trainer), "the trainer runs the default's parts")
    say("# One PPO iteration, every number\n")
    say("This page walks one iteration of `python train_ppo.py`'s default PPO over a batch of two "
        "prompts, with every intermediate number printed: the rollout, the KL-shaped rewards, "
        "the separate critic's values and GAE, then the update, minibatch by minibatch, with "
        "the ptx loss, the critic's own step and the early stop, and last the adaptive KL "
        "coefficient's move. It is written by `python bench/worked_trace.py` from the "
        "trainer's own functions (nothing here is computed by a copy of them), and "
        "tests/test_worked_trace.py fails if the page and the code disagree. The models are "
        "1-layer GPTs of width 8 over 12 token ids (0 is PAD, 1 is EOS); numbers are rounded "
        "to 4 decimals. Read it beside `ppo.py`, `losses.py` and `ppo_trainer.py`.\n")
    say("The setting. Every option is train_ppo.py's default, resolved as a run resolves it "
        "(`ppo_trainer.resolve_auto_options`), except for the sizes and one learning rate:\n")
    say(table(["option", "here", "default", "why"], [
        ["`rollout_batch_size`", str(cfg.rollout_batch_size), str(base.rollout_batch_size),
         "two prompts, so that every number fits on the page"],
        ["`max_new_tokens`", str(cfg.max_new_tokens), str(base.max_new_tokens), "the same"],
        ["`minibatch_size`", str(cfg.minibatch_size), str(base.minibatch_size),
         "each epoch is then one minibatch of the whole batch"],
        ["`actor_lr`", f"{cfg.actor_lr:g}", f"{base.actor_lr:g}",
         "at the default a tiny model's ratios would barely move in four steps; at this rate "
         "one step moves some past the clip, and the approx-KL passes `target_kl` within the "
         "update"]]) + "\n")
    say("The rest is the default's, among them: a separate critic (`critic` auto: separate "
        f"with a reward model) learning at `critic_lr` {cfg.critic_lr:g}; the ptx loss with "
        f"`ptx_coef` {cfg.ptx_coef} (auto for ppo); the KL penalty in the reward "
        f"(`kl_in` {cfg.kl_in}, `kl_estimator` {cfg.kl_estimator}) with the adaptive "
        f"controller (`adaptive_kl`), starting at `kl_coef` {cfg.kl_coef} and steering "
        f"towards `kl_target` {cfg.kl_target} at `kl_horizon` {cfg.kl_horizon:g}; the early "
        f"stop at `target_kl` {cfg.target_kl}; `ppo_epochs` {cfg.ppo_epochs}, `clip_range` "
        f"{cfg.clip_range}, `clip_range_value` {cfg.clip_range_value}, `gamma` {cfg.gamma}, "
        f"`lam` {cfg.lam}, `reward_clip` {cfg.reward_clip}, `missing_eos_penalty` "
        f"{cfg.missing_eos_penalty}, `grad_clip` {cfg.grad_clip}, `entropy_coef` "
        f"{cfg.entropy_coef}. The script checks that these are the options that differ. This is "
        "a run's first iteration, so the learning rates are at their peak (they decay "
        "linearly to 0 over `max_iters`).\n")
    say("The models stand in for the checkpoints a run loads. The reference (the SFT policy) is "
        "a random GPT; the actor is the reference with Gaussian noise of std "
        f"{NOISE} added to every weight, standing in for a policy that training has already "
        "moved away from its SFT start, so the KL is not 0 (in a run's first iteration the "
        "actor is the reference). The reward model is a random `heads.RewardModel` of the same "
        "size, untrained: its scores are arbitrary numbers, and what matters here is where they "
        "go. It scores the responses (`rewards.ModelReward`, as with `--reward rm`), and the "
        "critic starts from its weights, as `train_ppo.load_models` starts the critic from the "
        "reward model's checkpoint. The ptx loss's demonstrations are three made-up "
        "(prompt, response) pairs in a `data.SFTData`, as a run's SFT data would be:\n")
    data = trace.trainer.ptx_data
    say(table(["demonstration", "prompt", "response", "ids (EOS = 1)"],
              [[f"d{i}", prompt, response, " ".join(map(str, data.examples[i][0]))]
               for i, (prompt, response) in enumerate(DEMOS)]) + "\n")


def trainer_is_the_default(trainer: PPOTrainer) -> bool:
    """The trainer took the default's path at each choice: a separate critic with its own
    optimizer, the ptx loss on, the adaptive controller, the early stop armed."""
    return (trainer.critic is not None and trainer.value_head is None
            and trainer.critic_opt is not None and trainer.use_ptx
            and isinstance(trainer.kl_ctl, AdaptiveKLController) and trainer.cfg.target_kl > 0)


def rollout(trace: Trace) -> None:
    trainer, cfg, say = trace.trainer, trace.cfg, trace.say
    spec, beta = trainer.spec, trainer.kl_ctl.value
    ids, mask = prompt_batch()
    exp, stats = trainer.make_experience(ids, mask, torch.Generator().manual_seed(SAMPLE_SEED))
    trace.exp, trace.stats = exp, stats
    T, am = exp.prompt_len, exp.action_mask
    B, N = am.shape
    cols = trace.cols

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
    k1 = KL_ESTIMATORS[spec.kl_estimator](exp.logprobs, exp.ref_logprobs) * am
    say("## 3. The KL penalty and the score\n")
    say(f"The per-token KL estimate is {spec.kl_estimator} = log pi(token) - log pi_ref(token): "
        "one sample of the KL between the actor and the reference at that position. A single "
        "token's k1 can be negative (the actor made that token rarer than the reference did); "
        "only its expectation is the KL, which is >= 0. The KL coefficient beta starts at "
        f"{beta} (the adaptive controller moves it after the update, section 8).\n")
    say(table(["k1"] + cols, per_token("k1", k1, am)) + "\n")
    rm = trainer.reward_fn.rm
    with torch.no_grad():
        raw = rm(exp.sequences, exp.attention_mask)
    ended = ((exp.sequences[:, T:] == EOS) & am.bool()).any(-1)
    say("The reward model scores each whole sequence once, reading its head at the last real "
        "token, clipped to +-`reward_clip` "
        f"({cfg.reward_clip}). A response cut off by `max_new_tokens` without EOS gets "
        f"`missing_eos_penalty` ({cfg.missing_eos_penalty}) instead of the reward model's "
        "opinion of a half-written text.\n")
    say(table(["row", "RM score", "ended with EOS", "score used"],
              [[f"row {b}", float(raw[b]), "yes" if ended[b] else "no", float(exp.scores[b])]
               for b in range(B)]) + "\n")
    check(abs(float(raw.mean()) - stats["rm_score"]) < 1e-5, "the RM's scores vs make_experience's figure")

    # the score lands on the last action: make_experience's (B, N) `placed`
    placed = torch.zeros_like(am)
    placed[torch.arange(B), last_action_index(am)] = exp.scores
    check(close(placed.sum(-1), exp.scores), "the placed scores vs the experience's scores")
    say("`make_experience` places each score on its response's last action, in a (B, N) tensor "
        "`placed` that is 0 everywhere else (`ppo.last_action_index` finds the column). A "
        "single turn is an episode of one turn: an environment's episodes place a reward on "
        "each turn's last action in the same kind of tensor, and both take the same path from "
        "here.\n")
    say(table(["placed"] + cols, per_token("placed", placed, am)) + "\n")
    rewards = kl_shaped_rewards(placed, exp.logprobs, exp.ref_logprobs, am, beta,
                                KL_ESTIMATORS[spec.kl_estimator])
    say("`losses.experience_advantages`, the trainer's one call that turns a scored rollout "
        "into rewards, advantages and returns, hands `placed` to the KL's placement; with the "
        f"KL in the reward (`kl_in` {cfg.kl_in}) that is `ppo.kl_shaped_rewards`, given the "
        "(B, N) tensor: each token's reward is r_t = -beta x k1_t + placed_t. The KL is paid "
        "token by token, where it was spent, so the advantages can blame the tokens that "
        "spent it.\n")
    say(table(["reward"] + cols + ["sum"],
              [r + [num(float(rewards[b].sum()))] for b, r in enumerate(per_token("r", rewards, am))])
        + "\n")
    check(close(rewards, exp.rewards), "kl_shaped_rewards vs the experience's rewards")
    check(close(rewards.sum(-1), exp.scores - beta * k1.sum(-1)),
          "each row's rewards sum to its score - beta x its summed k1")
    check(close(kl_shaped_rewards(exp.scores, exp.logprobs, exp.ref_logprobs, am, beta), rewards),
          "kl_shaped_rewards' (B,) path (the score on the last token) vs its (B, N) path")

    # ------------------------------------------------------------------ values, GAE
    gamma, lam = spec.gamma, spec.lam
    values = exp.values
    say("## 4. The critic's values and GAE\n")
    say("The critic (`heads.Critic`) is a model of its own: a GPT trunk and a linear head read "
        "at every position, separate from the actor, learning with its own optimizer (section "
        "5). `train_ppo.load_models` starts it from the reward model's checkpoint "
        "(`heads.ScalarHeadModel.load_trunk_and_head`, which folds a trained reward model's "
        "normalisation into the head; this random one has gain 1 and bias 0, so the fold "
        "changes nothing), as InstructGPT does. Its value V_t, read at the position before "
        "token t, is its prediction of the rewards still to come in the response. Started "
        "from the reward model, its head at a position says what the reward model would score "
        "the text up to there (the trunk is causal), so V_t is at first the reward model's "
        "score of the prompt and the response's first t tokens: V_0 is its score of the prompt "
        "alone. The script checks this by scoring each prefix with the reward model.\n")
    say(table(["value"] + cols, per_token("V", values, am)) + "\n")
    with torch.no_grad():
        prefix = torch.stack([rm(exp.sequences[:, :T + t], exp.attention_mask[:, :T + t])
                              for t in range(N)], 1)  # (B, N): the RM's score before token t
    check(close(prefix * am, values), "the critic's first values vs the RM's scores of the prefixes")
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


# ----------------------------------------------------------------------------- learning
def forward(trainer: PPOTrainer, mb, ptx) -> dict:
    """What `_learn_minibatch` computes before its step, by the trainer's own calls: the
    actor's pass (with the ptx batch in it), `losses.actor_loss`, and the critic's values and
    value loss (`critic_step`'s)."""
    cfg, am = trainer.cfg, mb.action_mask
    with torch.no_grad():
        logprobs, entropy, _, ptx_loss = trainer.policy_and_values(
            mb.sequences, mb.attention_mask, mb.prompt_len, "value", with_values=False, ptx=ptx)
        loss, figures = actor_loss(logprobs, entropy, mb.logprobs, mb.ref_logprobs,
                                   mb.advantages, am, trainer.spec, trainer.kl_ctl.value,
                                   trainer.budget, None, mb.start_logprobs)
        values = trainer.critic_values(mb.sequences, mb.attention_mask, mb.prompt_len)
        vf = value_loss(values, mb.values, mb.returns, am, cfg.clip_range_value)
    return {"logprobs": logprobs, "ratio": torch.exp(logprobs - mb.logprobs) * am,
            "loss": loss, "figures": figures, "ptx_loss": ptx_loss, "values": values, "vf": vf,
            "total": loss + cfg.ptx_coef * ptx_loss}


def demonstrations(trainer: PPOTrainer, ptx) -> list[str]:
    """Which demonstrations (d0, d1, ...) the rows of a ptx batch are."""
    names = []
    for row, targets in zip(*ptx):
        found = []
        for i in range(len(trainer.ptx_data)):
            alone, alone_targets = trainer.ptx_data.batch([i])  # (1, w) each
            w = alone.size(1)
            if torch.equal(row[:w], alone[0]) and torch.equal(targets[:w], alone_targets[0]) \
                    and bool((targets[w:] == IGNORE).all()):
                found.append(i)
        check(len(found) == 1, "each row of the ptx batch is one demonstration")
        names.append(f"d{found[0]}")
    return names


def learning(trace: Trace) -> list[dict]:
    """The update as `PPOTrainer.learn` runs it: ppo_epochs over the replay buffer, each a
    fresh shuffle into minibatches, `_learn_minibatch` on each, until the early stop."""
    trainer, cfg, exp = trace.trainer, trace.cfg, trace.exp
    trainer.buffer.add(trainer.rows_to_learn(exp))
    shuffle = torch.Generator().manual_seed(SHUFFLE_SEED)
    shown, stopped = [], 0.0
    for epoch in range(cfg.ppo_epochs):
        for mb in trainer.buffer.minibatches(cfg.minibatch_size, shuffle, trainer.unit):
            check(torch.equal(mb.sequences, exp.sequences) and torch.equal(mb.values, exp.values),
                  "the shuffle keeps the rows in order (pick another SHUFFLE_SEED)")
            peek = torch.Generator()
            peek.set_state(shuffle.get_state())  # the ptx batch _learn_minibatch will draw
            ptx = trainer.ptx_batch(peek)
            step = forward(trainer, mb, ptx)
            section = [first_minibatch, second_minibatch, stopping_minibatch][min(len(shown), 2)]
            actor_before = [p.detach().clone() for p in trainer.actor_opt.params]
            critic_before = [p.detach().clone() for p in trainer.critic_opt.params]
            section(trace, mb, ptx, step)
            figures, stepped, stopped = trainer._learn_minibatch(mb, shuffle)  # the trainer's own
            for name in ("pg_loss", "clipfrac", "approx_kl"):
                check(close(figures[name], step["figures"][name]),
                      f"_learn_minibatch's {name} vs the page's")
            check(close(figures["ptx_loss"], step["ptx_loss"]), "_learn_minibatch's ptx_loss vs the page's")
            check(stepped == (not stopped), "a minibatch steps unless it stops the update")
            check((len(shown) == 2) == bool(stopped), "the early stop comes on the third minibatch "
                  "(at another size or rate, say which minibatch stops and why)")
            if stepped:
                check(close(figures["vf_loss"], step["vf"]), "critic_step's vf_loss vs the page's")
                stepped_note(trace, len(shown), actor_before, critic_before)
            else:
                check(all(torch.equal(p, q) for p, q in zip(trainer.actor_opt.params, actor_before))
                      and all(torch.equal(p, q)
                              for p, q in zip(trainer.critic_opt.params, critic_before)),
                      "a stopped minibatch moves no weight")
            shown.append({**{k: float(v) for k, v in figures.items()}, "stepped": stepped})
            if stopped:
                break
        if stopped:
            break
    check(bool(stopped), "the update stops early")
    return shown


def ratio_rows(mb, step) -> list:
    am = mb.action_mask
    return (per_token("old log-prob", mb.logprobs, am) + per_token("new log-prob", step["logprobs"], am)
            + per_token("ratio", step["ratio"], am))


def actor_total(trace: Trace, step, figures) -> str:
    cfg = trace.cfg
    return (f"The actor's loss is the policy loss - `entropy_coef` ({cfg.entropy_coef}) x the "
            f"entropy + `ptx_coef` ({cfg.ptx_coef}) x the ptx loss = "
            f"{num(float(figures['pg_loss']))} + {cfg.ptx_coef} x {num(float(step['ptx_loss']))} "
            f"= **{num(float(step['total']))}** (with the KL in the reward, no KL term joins it).")


def first_minibatch(trace: Trace, mb, ptx, step) -> None:
    trainer, cfg, say, cols = trace.trainer, trace.cfg, trace.say, trace.cols
    am, figures = mb.action_mask, step["figures"]
    B = am.size(0)
    say("## 5. The first minibatch: ratio 1, the ptx loss, the actor's and the critic's steps\n")
    say(f"`PPOTrainer.learn` puts the {B} rows in the replay buffer and makes `ppo_epochs` "
        f"({cfg.ppo_epochs}) passes over it, each shuffled anew into minibatches of "
        f"`minibatch_size` ({cfg.minibatch_size}): here each epoch is one minibatch of the whole "
        "batch (the shuffle only reorders its two rows, which changes no mean; the seed keeps "
        "them in order so that the tables line up). `PPOTrainer._learn_minibatch` takes one "
        "step of the actor and one of the critic on each, unless the early stop comes first.\n")
    say("The first minibatch's forward pass runs the same weights that sampled, so the new "
        "log-probs equal the old ones (to float rounding), the ratio is 1 on every token and "
        "nothing is clipped: PPO's first sanity check. The policy loss is then minus the mean "
        "whitened advantage, which is 0, but its gradient is not: it raises the log-prob of "
        "every token with a positive advantage and lowers the others.\n")
    check(close(step["ratio"], am), "the first minibatch's ratio is 1")
    say(table(["first minibatch"] + cols, per_token("new log-prob", step["logprobs"], am)
              + per_token("ratio", step["ratio"], am)) + "\n")
    check_surrogate(mb, step, trainer.spec)
    say(f"The policy loss (`ppo.policy_loss`, the mean over the {int(am.sum())} real tokens) is "
        f"**{num(float(figures['pg_loss']))}**; clipfrac, the share of tokens clipped, is "
        f"{num(float(figures['clipfrac']))}.\n")

    # ------------------------------------------------------------------ ptx
    inputs, targets = ptx
    names = demonstrations(trainer, ptx)
    with torch.no_grad():  # the demonstrations alone through the actor: each target's log-prob
        hidden = trainer.actor.trunk(inputs, input_mask(targets).long())
        logp, _ = lm_logprobs(trainer.actor, hidden, targets.clamp(min=0), suppress=trainer.suppress)
        alone = lm_loss(trainer.actor, inputs, targets, trainer.suppress)
    keep = targets != IGNORE
    check(close(-logp[keep].mean(), step["ptx_loss"]) and close(alone, step["ptx_loss"]),
          "the ptx loss on the demonstrations alone vs the one in the joint pass")
    W = inputs.size(1)
    rows = []
    for b, name in enumerate(names):
        rows.append([f"input, {name}"] + [str(int(x)) if input_mask(targets)[b, j] else ""
                                          for j, x in enumerate(inputs[b])])
        rows.append([f"target, {name}"] + [str(int(x)) if keep[b, j] else "-"
                                           for j, x in enumerate(targets[b])])
        rows.append([f"-log p, {name}"] + [num(-float(logp[b, j])) if keep[b, j] else ""
                                           for j in range(W)])
    say("### The ptx loss\n")
    say("InstructGPT's PPO-ptx mixes a language-model loss on demonstrations into the actor's "
        "loss, so that the policy keeps writing like its SFT data while it chases the reward. "
        f"`PPOTrainer.ptx_batch` draws `minibatch_size` ({cfg.minibatch_size}) demonstrations "
        f"at random (with replacement), here {' and '.join(names)}, right-padded: inputs and "
        "targets, the target at each position being the next token, or - (ignored) on the "
        "prompt and the padding, so the loss is on the response and its EOS only (a blank "
        "input is padding past the row's last target, which the trunk skips). "
        "`PPOTrainer.policy_and_values(..., ptx=...)` runs them through the actor's trunk in "
        "the same forward pass as the minibatch's sequences (stacked under them, padded to "
        "one width), so one backward pass gives both gradients; the ptx loss is the mean over "
        "the targets of -log p(target).\n")
    say(table(["ptx batch"] + [f"{j}" for j in range(W)], rows) + "\n")
    say(f"The ptx loss is **{num(float(step['ptx_loss']))}** (the script checks that the "
        "demonstrations alone give the same: the minibatch beside them changes nothing). "
        + actor_total(trace, step, figures) + "\n")
    say(f"`ppo.approx_kl`, how far the update has moved the policy since it started, is "
        f"{num(float(figures['approx_kl']))} (the ratio is 1): below `target_kl` "
        f"({cfg.target_kl}), so `_learn_minibatch` back-propagates the actor's loss, clips the "
        f"gradient's norm to `grad_clip` ({cfg.grad_clip}) and takes one AdamW step at "
        f"`actor_lr` {cfg.actor_lr:g}.\n")
    value_section(trace, mb, step, first=True)


def check_surrogate(mb, step, spec) -> tuple:
    """The two branches inside ppo.policy_loss, token by token (their mean is checked)."""
    am, figures, ratio = mb.action_mask, step["figures"], step["ratio"]
    unclipped = -mb.advantages * ratio
    clipped = -mb.advantages * ratio.clamp(1 - spec.clip_range, 1 + spec.clip_high)
    taken = torch.max(unclipped, clipped)
    check(close(masked_mean(taken, am), figures["pg_loss"]),
          "the per-token surrogates' mean vs ppo.policy_loss")
    check(close(masked_mean((clipped > unclipped).float(), am), figures["clipfrac"]),
          "the clipped tokens vs ppo.policy_loss's clipfrac")
    return unclipped, clipped, taken


def value_section(trace: Trace, mb, step, first: bool) -> None:
    cfg, say, cols = trace.cfg, trace.say, trace.cols
    am, new_v = mb.action_mask, step["values"]
    vclipped = mb.values + (new_v - mb.values).clamp(-cfg.clip_range_value, cfg.clip_range_value)
    check(close(0.5 * masked_mean(torch.max((new_v - mb.returns) ** 2,
                                            (vclipped - mb.returns) ** 2), am), step["vf"]),
          "the per-token value losses' mean vs ppo.value_loss")
    say("### The critic's step\n" if first else "The critic's step, on the moved critic:\n")
    if first:
        say("Then, only if the actor stepped, `PPOTrainer.critic_step`: the critic's own "
            "forward pass over the minibatch (`critic_values`), its clipped value loss "
            "(`ppo.value_loss`), its own backward pass and its own AdamW step at `critic_lr` "
            f"({cfg.critic_lr:g}). The value loss is 0.5 x the mean over real tokens of the "
            "larger of (V_new - R)^2 and (V_clip - R)^2, where V_clip is V_new kept within "
            f"`clip_range_value` ({cfg.clip_range_value}) of the old value. It never meets the "
            f"actor's loss: `vf_coef` ({cfg.vf_coef}) weighs it only for a shared critic, whose "
            "loss joins the actor's on one trunk. On the first step V_new is the old value, so "
            "the two terms are the same.\n")
    rows = per_token("R", mb.returns, am) + per_token("V_old", mb.values, am) + per_token("V_new", new_v, am)
    if not first:
        rows += (per_token("V_clip", vclipped, am)
                 + per_token("0.5 (V_new - R)^2", 0.5 * (new_v - mb.returns) ** 2, am)
                 + per_token("0.5 (V_clip - R)^2", 0.5 * (vclipped - mb.returns) ** 2, am))
    say(table(["value loss"] + cols, rows) + "\n")
    if not first:
        say("The critic moved on its first step, so here the clip can matter. "
            + clip_notes(mb, new_v, vclipped, cfg.clip_range_value) + "\n")
    say(f"The value loss is **{num(float(step['vf']))}**.\n")


def clip_notes(mb, new_v, vclipped, clip: float) -> str:
    """What the value clip did, token by token, where a value moved past it."""
    am, R = mb.action_mask, mb.returns
    held = ((new_v - mb.values).abs() > clip) & am.bool()
    if not held.any():
        return "No value moved past the clip this time, so the two terms are the same."
    notes = []
    for b, t in held.nonzero().tolist():
        gone = abs(float(new_v[b, t] - mb.values[b, t]))
        past = float((vclipped[b, t] - R[b, t]) ** 2) > float((new_v[b, t] - R[b, t]) ** 2)
        notes.append(
            f"At row {b} t={t} the critic's step moved the value by {num(gone)}, past "
            f"{clip}: V_clip stops at {num(float(vclipped[b, t]))}, "
            + ("further from R than V_new, so the larger term is the clipped one, which does "
               "not change with V_new: the loss no longer pushes this value towards R (the "
               "clip does not bound how far a value moves, it stops pulling it further)."
               if past else
               "nearer to R than V_new, so the larger term is the unclipped one and the loss "
               "still pulls V_new back."))
    return " ".join(notes)


def stepped_note(trace: Trace, index: int, actor_before, critic_before) -> None:
    trainer, cfg, say = trace.trainer, trace.cfg, trace.say
    actor = moved(trainer.actor_opt.params, actor_before, cfg.actor_lr)
    critic = moved(trainer.critic_opt.params, critic_before, cfg.critic_lr)
    say(("On AdamW's first step every weight with a nonzero gradient moves by about the "
         "learning rate, whatever its gradient's size (Adam divides the gradient by its own "
         "running magnitude). " if index == 0 else "")
        + f"After this minibatch's steps, in the actor {actor}; in the critic {critic}.\n")


def second_minibatch(trace: Trace, mb, ptx, step) -> None:
    trainer, cfg, say, cols = trace.trainer, trace.cfg, trace.say, trace.cols
    am, figures, spec = mb.action_mask, step["figures"], trainer.spec
    eps = spec.clip_range
    say("## 6. The second minibatch: the ratio and the clip\n")
    say("The second epoch's minibatch, the same rows, after both steps. The ratio is "
        "pi_new(token) / pi_old(token) = exp(new log-prob - old log-prob).\n")
    say(table(["second minibatch"] + cols, ratio_rows(mb, step)) + "\n")
    unclipped, clipped, taken = check_surrogate(mb, step, trainer.spec)
    say(f"`ppo.policy_loss` takes, per token, the larger (the more pessimistic) of the "
        f"unclipped surrogate -A x ratio and the clipped one "
        f"-A x clip(ratio, {1 - eps:.1f}, {1 + spec.clip_high:.1f}). Where the clipped "
        "one is larger, the ratio has already moved past the clip in the direction the "
        "advantage wants: that token's loss is flat in the ratio and it gets no "
        "gradient, so one minibatch cannot push a token's probability far. Where the "
        "ratio moved the other way, the unclipped term is the larger and still pulls "
        "it back.\n")
    say(table(["surrogate"] + cols,
              per_token("A (whitened)", mb.advantages, am)
              + per_token("-A x ratio", unclipped, am)
              + per_token("-A x clip(ratio)", clipped, am)
              + per_token("clipped (1 = yes)", (clipped > unclipped).float(), am, bool_fmt)
              + per_token("loss", taken, am)) + "\n")
    say(f"The policy loss is the mean of the per-token loss over the {int(am.sum())} real "
        f"tokens: **{num(float(figures['pg_loss']))}**; clipfrac is "
        f"{num(float(figures['clipfrac']))}. A fresh ptx batch rides along ("
        f"{' and '.join(demonstrations(trainer, ptx))}), with a ptx loss of "
        f"{num(float(step['ptx_loss']))}. " + actor_total(trace, step, figures) + "\n")
    check(float(figures["approx_kl"]) <= cfg.target_kl, "the second minibatch steps")
    say(f"`ppo.approx_kl` is now the mean over tokens of (ratio - 1) - log(ratio) (>= 0, and 0 "
        f"only where the ratio is 1): {num(float(figures['approx_kl']))}, still below "
        f"`target_kl` ({cfg.target_kl}), so both steps are taken again.\n")
    value_section(trace, mb, step, first=False)


def stopping_minibatch(trace: Trace, mb, ptx, step) -> None:
    trainer, cfg, say, cols = trace.trainer, trace.cfg, trace.say, trace.cols
    am, figures = mb.action_mask, step["figures"]
    log_ratio = step["logprobs"] - mb.start_logprobs
    k3 = (torch.exp(log_ratio) - 1 - log_ratio) * am
    check(close(masked_mean(k3, am), figures["approx_kl"]), "approx-KL's tokens vs ppo.approx_kl")
    check(close(approx_kl(step["logprobs"], mb.start_logprobs, am), figures["approx_kl"]),
          "ppo.approx_kl vs losses.actor_loss's")
    check_surrogate(mb, step, trainer.spec)
    kl = float(figures["approx_kl"])
    say("## 7. The third minibatch: the early stop\n")
    say("The third epoch's minibatch, after two steps. Its loss is computed as before "
        f"(policy loss {num(float(figures['pg_loss']))}, clipfrac "
        f"{num(float(figures['clipfrac']))}, ptx loss {num(float(step['ptx_loss']))} on "
        f"{' and '.join(demonstrations(trainer, ptx))}), and before stepping "
        "`_learn_minibatch` asks how far the update has moved the policy: `ppo.approx_kl`, "
        "the mean over tokens of (ratio - 1) - log(ratio), against the log-probs the update "
        "started from.\n")
    say(table(["third minibatch"] + cols, ratio_rows(mb, step)
              + per_token("(ratio - 1) - log(ratio)", k3, am)) + "\n")
    say(f"The approx-KL is **{num(kl)}**, past `target_kl` ({cfg.target_kl}): the policy has "
        "moved this far already, so the update stops before this minibatch moves it more. "
        "`_learn_minibatch` drops the gradients its backward pass gathered "
        "(`optim.Optimizer.discard`), takes no actor step and no critic step, and returns the "
        f"approx-KL; `learn` then breaks out, and the epochs left ({cfg.ppo_epochs - 3} of "
        f"`ppo_epochs` {cfg.ppo_epochs}) never run. This stop is the default `target_kl`'s own, not "
        f"forced: at `actor_lr` {cfg.actor_lr:g} the approx-KL passes {cfg.target_kl} on the "
        "third minibatch. It guards against the sudden KL spikes of a run whose update "
        "overshoots.\n")


def after_the_update(trace: Trace, shown: list[dict]) -> None:
    trainer, cfg, say, stats = trace.trainer, trace.cfg, trace.say, trace.stats
    ctl = trainer.kl_ctl
    # the trainer's own step() from the same start: the same rollout, steps, stop and beta
    twin = build(options())
    ids, mask = prompt_batch()
    _, logged = twin.step([(ids, mask)], torch.Generator().manual_seed(SAMPLE_SEED),
                          torch.Generator().manual_seed(SHUFFLE_SEED))
    check(all(close(p, q) for p, q in zip(trainer.actor_opt.params, twin.actor_opt.params)),
          "PPOTrainer.step takes the actor's steps shown here")
    check(all(close(p, q) for p, q in zip(trainer.critic_opt.params, twin.critic_opt.params)),
          "PPOTrainer.step takes the critic's steps shown here")
    steps = sum(s["stepped"] for s in shown)
    check(logged["minibatch_steps"] == steps and close(logged["early_stop_kl"], shown[-1]["approx_kl"]),
          "learn's count of steps and its early_stop_kl vs the page's")
    for name in ("pg_loss", "clipfrac", "approx_kl", "ptx_loss"):
        check(close(logged[name], sum(s[name] for s in shown) / len(shown)),
              f"learn's {name}: the mean over the minibatches shown")
    check(close(logged["vf_loss"], sum(s["vf_loss"] for s in shown if "vf_loss" in s) / steps),
          "learn's vf_loss: the mean over the critic's steps")
    check(close(stats["kl"], logged["kl"]), "the batch's KL vs step's figure")

    say("## 8. After the update: the logged figures and the adaptive KL coefficient\n")
    say("`PPOTrainer.learn` runs exactly this loop, then clears the replay buffer: PPO is "
        "on-policy, so the next iteration samples a fresh batch with the new actor. The script "
        "runs the trainer's own `PPOTrainer.step` (roll out, learn, update beta) on a second "
        "trainer built from the same start, with the same seeds, and checks that it ends at "
        "the same actor, critic and beta and logs these figures of the update (each a mean "
        "over the minibatches whose loss was computed, the stopped one included; `vf_loss` "
        "over the critic's steps):\n")
    say(table(["figure", "value", "what"], [
        ["`pg_loss`", logged["pg_loss"], "the policy loss, mean of the three minibatches'"],
        ["`clipfrac`", logged["clipfrac"], "the share of tokens clipped, the same mean"],
        ["`ptx_loss`", logged["ptx_loss"], "the ptx loss, the same mean"],
        ["`approx_kl`", logged["approx_kl"], "the approx-KL, the same mean"],
        ["`vf_loss`", logged["vf_loss"], f"the value loss, mean of the critic's {steps} steps'"],
        ["`minibatch_steps`", str(logged["minibatch_steps"]), "the optimizer steps taken"],
        ["`early_stop_kl`", logged["early_stop_kl"], "the approx-KL that stopped the update"],
        ["`kl`", logged["kl"], "the batch's KL to the reference, below"],
        ["`kl_coef`", logged["kl_coef"], "beta of this iteration's rewards"]]) + "\n")

    k1 = (trace.exp.logprobs - trace.exp.ref_logprobs) * trace.exp.action_mask
    check(close(k1.sum(-1).mean(), stats["kl"]), "the batch's KL vs make_experience's figure")
    before = ctl.value
    ctl.update(stats["kl"])  # what step() does last
    check(close(ctl.value, twin.kl_ctl.value), "the controller's beta vs step()'s")
    error = math.log(max(stats["kl"], 1e-8) / ctl.target)
    clipped = min(max(error, ctl.DOWN), ctl.UP)
    check(abs(min(max(before * math.exp(clipped / ctl.horizon), ctl.low), ctl.high) - ctl.value)
          < 1e-9, "the formula's numbers give the controller's beta")
    bound = ("inside it" if ctl.low < ctl.value < ctl.high else
             f"so beta is held at the bound, {num(ctl.value)}")
    say(f"Last, `PPOTrainer.step` hands the logged `kl` to the adaptive controller "
        "(`ppo.AdaptiveKLController.update`). That KL is the batch's KL to the reference: the "
        "mean over responses of each response's summed k1, here "
        f"{num(float(stats['kl']))} (the rows' sums are "
        + " and ".join(num(float(x)) for x in k1.sum(-1))
        + ": one response's can be negative, only the expectation cannot). The controller "
        "steers it towards `kl_target`, in log space, once per iteration:\n")
    say("    log beta += clip(log(KL / target), -0.2, 1) / horizon\n")
    say(table(["step", "value"], [
        ["KL / target", f"{num(stats['kl'])} / {cfg.kl_target} = {num(stats['kl'] / ctl.target)}"],
        ["log(KL / target)", error],
        [f"clipped to [{ctl.DOWN}, {ctl.UP}]", clipped],
        [f"/ horizon ({ctl.horizon:g}): the move of log beta", clipped / ctl.horizon],
        ["beta before", before],
        [f"beta after = {num(before)} x e^({num(clipped / ctl.horizon)})", ctl.value],
        [f"the bound [kl_coef / {ctl.RANGE:g}, {ctl.RANGE:g} x kl_coef]",
         f"[{num(ctl.low)}, {num(ctl.high)}]: {bound}"]]) + "\n")
    down, up = (100 * (math.exp(x / ctl.horizon) - 1) for x in (ctl.DOWN, ctl.UP))
    say("The clip is asymmetric: a KL far below target, as here, lowers beta by at most "
        f"x e^({ctl.DOWN}/{ctl.horizon:g}) an iteration ({down:.0f} %), while one above "
        f"raises it by up to x e^({ctl.UP:g}/{ctl.horizon:g}) (+{up:.1f} %): the KL is how far the policy has "
        "drifted, and drift takes many updates to undo, so beta rises fast and falls slowly "
        "(`ppo.AdaptiveKLController` says why). The bound keeps a run that collapses from "
        "winding beta up without limit. The next iteration's rewards are shaped with beta = "
        f"{num(ctl.value)}.\n")


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
