"""Rollouts recorded at each eval: what the policy wrote, and how each of its tokens was judged.

The curves of metrics.jsonl are means over thousands of tokens. To see *why* a run went where
it went, look at single responses: which tokens the advantage credited or charged, where the
policy moved away from the reference (the KL), what the critic expected (the value). At every
eval a run records the same few held-out prompts (the first `count` of the eval; with an
environment, the episodes of seeds 0 .. count - 1), so a prompt can be followed from the
first eval to the last. `python -m mingpt_rlhf.run.report RUN_DIR` draws them (run/report.py).

Nothing is computed twice: the numbers are those of the eval's own Experience, made by the
trainer as training makes it (`PPOTrainer.make_experience` / `play`):

- ppo, reinforce++: the eval's first `count` responses, with their GAE advantages (whitened
  over the eval batch, as training whitens over a rollout batch), values and shaped rewards;
- grpo, rloo: an advantage is a response's reward against the others of its *group*, and an
  eval samples one response per prompt, so each recorded prompt is sampled again as a group
  of `group_size` (one extra rollout of count x group_size responses per eval, no update),
  with a generator seeded the same at every eval, and given its advantages by the trainer's
  `group_baselined`;
- the per-token entropy is the one number an Experience does not keep: one forward pass of the
  actor over the recorded rows gives it (`PPOTrainer.policy_and_values`);
- each token's weight in the update, what multiplies grad log pi(token) when the recorded rows
  are learnt as one minibatch at its first step (ratio 1): the advantage x the reduction's
  normaliser, plus the KL term's share with the KL in the loss (`losses.token_weights`, by
  autograd through the trainer's own `actor_loss`).

out_dir/rollouts.jsonl holds one JSON line per (eval step, recorded response):

    {"step": 20, "prompt_index": 0, "member": 0, "prompt": "the plot was", "ids": [...],
     "tokens": [" great", " <eos>"],            # each token's text; "".join() is the response
     "env": [0, 0],                              # 1: an environment's token (episodes), no action
     "logprob": [...], "ref_logprob": [...],     # per token (null on the environment's tokens)
     "value": [...] or null (no critic), "advantage": [...], "reward": [...], "entropy": [...],
     "weight": [...], "weight_kl": [...], "normaliser": [...],  # losses.token_weights
     "score": 1.2, "kl": 0.8, "kl_coef": 0.05, "resp_len": 2,
     "gold": 0.9 (a built-in task) | "check": {...} (an environment's own figures)}

Numbers are rounded to 4 significant digits. The file's size is bounded: count (x group_size
for grpo / rloo) responses x evals (max_iters / eval_interval + 1) x their tokens (at most
max_new_tokens, or max_turns x (max_new_tokens + a reply) with an environment) x 6 numbers;
the default PPO run writes 8 x 11 responses of at most 32 tokens, about 0.1 MB. It is appended
like metrics.jsonl, and cut to the checkpoint's step on `--resume` (metrics.restart_log), so a
resumed run's file equals an uninterrupted run's. Under torchrun rank 0 records (it alone
evaluates).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import torch

from ..machinery.errors import UserError
from ..losses import GROUP_ALGOS, GROUP_BASELINES, token_weights
from ..methods.online_dpo import pair_rows, row_signs
from .metrics import restart_log
from ..ppo import last_action_index

GROUPED = GROUP_ALGOS  # advantages relative to a group of responses to the same prompt


def rounded(x: float):
    """4 significant digits, as a plain float; None for a non-finite number (JSON has none)."""
    return float(f"{x:.4g}") if math.isfinite(x) else None


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text, such that "".join() is the decoded response: the piece each token
    adds to the decoded prefix (a word tokenizer's space between words included). A byte-level
    BPE token can hold half of a character: the character is given to the token that completes
    it, and the one before gets "". A tokenizer whose prefixes do not grow by appending gets
    each token decoded alone."""
    texts, before = [], ""
    for i in range(len(ids)):
        now = tokenizer.decode(ids[:i + 1])
        if i < len(ids) - 1:
            now = now.rstrip("\ufffd")  # a character not finished yet (decoded as U+FFFD)
        texts.append(now[len(before):] if now.startswith(before) else tokenizer.decode(ids[i:i + 1]))
        before = now
    return texts


class RolloutRecorder:
    """Writes out_dir/rollouts.jsonl (module docstring). `count` 0 records nothing.
    `task` (gold reward) or `env_class` (its `figures`) judge each response; `seed` seeds the
    groups sampled for grpo / rloo; `resume_step`: the checkpoint's step when resuming."""

    def __init__(self, out_dir: str, count: int, tokenizer, seed: int = 0, task=None,
                 env_class=None, resume_step: int | None = None):
        from ..machinery.distributed import is_main
        self.path = os.path.join(out_dir, "rollouts.jsonl")
        self.count = count if is_main() else 0
        self.tokenizer, self.seed, self.task, self.env_class = tokenizer, seed, task, env_class
        self.seconds = 0.0  # time spent recording (bench/report_cost.py reads it)
        if self.count or (is_main() and resume_step is not None and os.path.exists(self.path)):
            # resumed: the lines past the checkpoint came from the killed run, recording or not
            os.makedirs(out_dir, exist_ok=True)
            restart_log(self.path, resume_step, "rollouts file")
        elif is_main() and os.path.exists(self.path):
            os.remove(self.path)  # an earlier run's recording in this folder would be stale

    @torch.no_grad()
    def record(self, trainer, step: int, exp, first: int = 0, fields: dict | None = None,
               episodes=None) -> None:
        """Record what this eval batch holds of the first `count` responses. `exp` is the
        batch's Experience, whose row 0 is the eval's response number `first`; `fields` its
        rows' extra prompt fields (for a reward function), `episodes` its Episodes (--env)."""
        if first >= self.count:
            return
        t0 = time.time()
        rows = list(range(min(len(exp.scores), self.count - first)))
        members = 1
        if trainer.cfg.algo in GROUPED:
            exp, episodes, members = self._groups(trainer, exp, rows, fields, episodes)
            rows = list(range(len(exp.scores)))
        entropy = self._entropy(trainer, exp, rows)
        weights = self._weights(trainer, exp, rows)
        lines = [self._line(trainer, step, exp, row, entropy[i], first + row // members,
                            row % members, episodes, {k: w[i] for k, w in weights.items()})
                 for i, row in enumerate(rows)]
        try:
            with open(self.path, "a") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
        except OSError as e:
            raise UserError(f"cannot append to {self.path} ({e.strerror or e}); free disk space, "
                            f"then --resume (the last checkpoint is intact)") from None
        self.seconds += time.time() - t0

    def _groups(self, trainer, exp, rows, fields, episodes):
        """(Experience, Episodes or None, group_size): the prompts (or seeds) of `rows`, each
        sampled as a group of group_size, with the advantages training would give them."""
        k = trainer.cfg.group_size
        device = exp.sequences.device
        gen = torch.Generator(device=device).manual_seed(self.seed + 8)  # the same every eval
        # sampled as an eval samples (for_update=False: the current policy, nothing that
        # involves the other processes, since only rank 0 evaluates), then the group advantages
        # by the trainer's own function, from each response's reward (the same on each token)
        if episodes is not None:
            seeds = [s for s in episodes.seeds[:len(rows)] for _ in range(k)]
            exp, _, episodes = trainer.play(seeds, gen, for_update=False)
            keys = torch.tensor(seeds, device=device)[:, None]
        else:
            T = exp.prompt_len
            index = torch.tensor(rows, device=device).repeat_interleave(k)
            fields = {name: [values[i] for i in index.tolist()]
                      for name, values in (fields or {}).items()}
            exp, _ = trainer.make_experience(exp.sequences[index, :T], exp.attention_mask[index, :T],
                                             gen, for_update=False, fields=fields)
            keys = exp.sequences[:, :T]
        if trainer.spec.advantages in GROUP_BASELINES:  # an eval batch has none: computed here
            last = last_action_index(exp.action_mask)[:, None]
            rewards = exp.rewards.gather(1, last).squeeze(1)              # (B,) one per response
            advantages = trainer.group_baselined(rewards, keys)[:, None] * exp.action_mask
            exp = dataclasses.replace(exp, advantages=advantages)
        return exp, episodes, k

    def _entropy(self, trainer, exp, rows) -> torch.Tensor:
        """(len(rows), N) the actor's entropy at each response position of `rows`, in slices
        of the trainer's scoring batch (a group rollout has as many rows as a training one)."""
        step = trainer.cfg.score_batch_size or trainer.cfg.minibatch_size
        parts = []
        for i in range(0, len(rows), step):
            index = torch.tensor(rows[i:i + step], device=exp.sequences.device)
            with trainer.amp():
                parts.append(trainer.policy_and_values(exp.sequences[index], exp.attention_mask[index],
                                                       exp.prompt_len, "value", with_values=False)[1])
        return torch.cat(parts).float()

    def _weights(self, trainer, exp, rows) -> dict:
        """(len(rows), N) tensors: each token's weight in an update on these rows as one
        minibatch, at its first step (ratio 1), and its parts (`losses.token_weights`)."""
        part = exp.select(torch.tensor(rows, device=exp.sequences.device))
        pairs = None
        if trainer.spec.policy_loss == "dpo":  # online DPO learns from one pair per group
            pairs = pair_rows(row_signs(part.advantages, part.action_mask), trainer.cfg.group_size)
        learnt = part.select(pairs) if pairs is not None else part
        weights = token_weights(learnt.logprobs, learnt.logprobs, learnt.ref_logprobs,
                                learnt.advantages, learnt.action_mask, trainer.spec,
                                trainer.kl_ctl.value, trainer.budget)
        if pairs is not None:  # the other members of a group: no weight
            return {k: torch.zeros_like(part.logprobs).index_copy(0, pairs, weights[k])
                    for k in ("weight", "kl", "normaliser")}
        return {k: weights[k] for k in ("weight", "kl", "normaliser")}

    def _line(self, trainer, step, exp, row, entropy, prompt_index, member, episodes,
              weights) -> dict:
        """The JSON line of response `row` of `exp` (module docstring)."""
        T = exp.prompt_len
        seq, attn = exp.sequences[row].tolist(), exp.attention_mask[row].tolist()
        acted = exp.action_mask[row].bool().tolist()
        # the response's columns: up to its last real token (an episode's replies included)
        n = max((i + 1 for i, a in enumerate(attn[T:]) if a), default=0)
        ids = seq[T:T + n]
        env = [0 if acted[i] else 1 for i in range(n)]

        def per_token(x):
            values = x.float().tolist()
            return [None if env[i] else rounded(values[i]) for i in range(n)]
        critic = trainer.critic is not None or trainer.value_head is not None
        prompt = self.tokenizer.decode([t for t, a in zip(seq[:T], attn[:T]) if a])
        line = {
            "step": step, "prompt_index": prompt_index, "member": member, "prompt": prompt,
            "ids": ids, "tokens": token_texts(self.tokenizer, ids), "env": env,
            "logprob": per_token(exp.logprobs[row]), "ref_logprob": per_token(exp.ref_logprobs[row]),
            "value": per_token(exp.values[row]) if critic else None,
            "advantage": per_token(exp.advantages[row]), "reward": per_token(exp.rewards[row]),
            "entropy": per_token(entropy), "weight": per_token(weights["weight"]),
            "weight_kl": per_token(weights["kl"]), "normaliser": per_token(weights["normaliser"]),
            "score": rounded(exp.scores[row].item()),
            "kl": rounded(((exp.logprobs[row] - exp.ref_logprobs[row]) * exp.action_mask[row]).sum().item()),
            "kl_coef": rounded(trainer.kl_ctl.value), "resp_len": sum(acted[:n]),
        }
        if episodes is not None:
            from ..methods.episodes import environment_figures
            line["seed"] = episodes.seeds[row]
            figures = environment_figures(self.env_class, [episodes.transcripts[row]],
                                          [episodes.returns[row].item()])
            if figures:
                line["check"] = {k: rounded(float(v)) for k, v in figures.items()}
        elif self.task is not None:
            response = self.tokenizer.decode([t for t, a in zip(ids, acted[:n]) if a])
            line["gold"] = rounded(float(self.task.gold_reward(prompt, response)))
        return line
