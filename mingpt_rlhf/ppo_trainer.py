"""One PPO iteration for a language model: make experience, then learn from it.

    make_experience: prompts -> actor samples -> log-probs (actor, reference) -> values
                     -> reward-model scores -> KL-shaped rewards -> GAE -> Experience
    learn:           ppo_epochs x shuffled minibatches of the replay buffer
                     -> clipped policy loss (+ ptx, - entropy bonus) -> clipped value loss
                     -> early stop when a minibatch's approx-KL passes target_kl

Four models (RLHF_NOTES.md): the actor (trained), the reference (frozen SFT), the reward
function (frozen RM, given as `reward_fn`), and the critic. The critic is either `separate`
(its own trunk, InstructGPT / DeepSpeed-Chat) or `shared` (a value head on the actor's trunk,
lm-human-preferences / trl: one forward pass gives logits and values, and the loss is
policy + vf_coef * value).

All models run with dropout off, so on the first minibatch of the first epoch the new
log-probs equal the stored ones: ratio 1, approx-KL 0. That is PPO's first sanity check.
The same `temperature` divides the logits when sampling and when computing log-probs, or the
stored log-probs would not be those of the policy that sampled ("negative KL").
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

from .data import IGNORE
from .ppo import (Experience, ReplayBuffer, explained_variance, gae, kl_shaped_rewards,
                  masked_mean, masked_whiten, policy_loss, token_logprobs, value_loss)
from .sampling import generate


class PPOTrainer:
    def __init__(self, cfg, actor, ref, reward_fn, critic=None, value_head=None,
                 eos_id: int | None = 1, pad_id: int = 0, kl_ctl=None, ptx_data=None,
                 amp=contextlib.nullcontext):
        """`cfg` holds the PPO options (see train_ppo.Config). Give `critic` (separate) or
        `value_head` (shared, a Linear(n_embd, 1) on the actor's trunk), not both.
        `reward_fn(sequences, attention_mask, action_mask) -> (B,)` raw scores.
        `amp()` gives the mixed-precision context for forward passes. It must not span an
        optimizer step: autocast caches low-precision copies of the weights for as long as
        it is open, and they would go stale after the update."""
        assert (critic is None) != (value_head is None), "give a critic or a value head"
        self.cfg, self.actor, self.ref, self.reward_fn = cfg, actor, ref, reward_fn
        self.critic, self.value_head = critic, value_head
        self.eos_id, self.pad_id = eos_id, pad_id
        self.kl_ctl, self.ptx_data, self.amp = kl_ctl, ptx_data, amp
        actor_params = list(actor.parameters())
        if value_head is not None:
            actor_params += list(value_head.parameters())
        # fused: one kernel for the whole update instead of ~10 small ops per parameter
        device = next(actor.parameters()).device
        adam = dict(betas=(0.9, 0.95), weight_decay=0.0, fused=device.type in ("cpu", "cuda"))
        self.actor_opt = torch.optim.AdamW(actor_params, lr=cfg.actor_lr, **adam)
        self.critic_opt = (torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, **adam)
                           if critic is not None else None)
        self.buffer = ReplayBuffer(pad_id)
        self.skipped_updates = 0  # updates skipped for a non-finite loss (should stay 0)

    # ------------------------------------------------------------------ forward passes
    def policy_and_values(self, sequences, attention_mask, T: int):
        """Response-aligned logits (B, N, V) / temperature and values (B, N).

        Column i scores the i-th response token, so it comes from position T - 1 + i: the
        logit and the value *before* the token was chosen."""
        hidden = self.actor.trunk(sequences, attention_mask)           # (B, T + N, C)
        hidden = hidden[:, T - 1:-1]                                    # (B, N, C)
        logits = self.actor.lm_head(hidden) / self.cfg.temperature      # (B, N, V)
        if self.value_head is not None:
            values = self.value_head(hidden).squeeze(-1)               # (B, N)
        else:
            values = self.critic(sequences, attention_mask)[:, T - 1:-1]
        return logits, values

    @torch.no_grad()
    def make_experience(self, prompt_ids, prompt_mask, generator=None) -> tuple[Experience, dict]:
        cfg = self.cfg
        t0 = time.time()
        with self.amp():
            out = generate(self.actor, prompt_ids, prompt_mask, cfg.max_new_tokens,
                           temperature=cfg.temperature, top_k=cfg.top_k or None,
                           top_p=cfg.top_p if cfg.top_p < 1 else None, eos_token_id=self.eos_id,
                           pad_token_id=self.pad_id, generator=generator)
        t1 = time.time()
        seqs, attn, T = out.sequences, out.attention_mask, out.prompt_len
        responses = seqs[:, T:]                                         # (B, N)
        action_mask = out.action_mask[:, T:].float()                    # (B, N)

        with self.amp():
            logits, values = self.policy_and_values(seqs, attn, T)
            ref_logits = self.ref(seqs, attn)[:, T - 1:-1] / cfg.temperature
            raw = self.reward_fn(seqs, attn, action_mask).float()
        logprobs, entropy = token_logprobs(logits, responses, with_entropy=True)
        logprobs = logprobs * action_mask
        ref_logprobs = token_logprobs(ref_logits, responses) * action_mask
        values = values.float() * action_mask

        scores = raw.clamp(-cfg.reward_clip, cfg.reward_clip)
        if self.eos_id is None:  # a task without EOS: every response is complete
            ended = torch.ones_like(scores, dtype=torch.bool)
        else:
            ended = ((responses == self.eos_id) & action_mask.bool()).any(-1)
        # a response cut off by max_new_tokens gets a fixed penalty instead of the RM's
        # opinion of a half-written text
        scores = torch.where(ended, scores, torch.full_like(scores, cfg.missing_eos_penalty))

        kl_coef = self.kl_ctl.value
        rewards = kl_shaped_rewards(scores, logprobs, ref_logprobs, action_mask, kl_coef)
        advantages, returns = gae(rewards, values, action_mask, cfg.gamma, cfg.lam)
        advantages = masked_whiten(advantages, action_mask)
        exp = Experience(seqs, attn, action_mask, logprobs, ref_logprobs, values, rewards,
                         advantages, returns, scores)
        t2 = time.time()

        kl_per_seq = ((logprobs - ref_logprobs) * action_mask).sum(-1)  # sum over tokens
        stats = {
            "rm_score": raw.mean().item(),
            "score": scores.mean().item(),
            "kl": kl_per_seq.mean().item(),
            "kl_coef": kl_coef,
            "entropy": masked_mean(entropy, action_mask).item(),
            "explained_var": explained_variance(values, returns, action_mask),
            "resp_len": action_mask.sum(-1).mean().item(),
            "eos_rate": ended.float().mean().item(),
            "t_generate": t1 - t0, "t_score": t2 - t1,
        }
        return exp, stats

    # ------------------------------------------------------------------ learning
    def ptx_loss(self, generator=None):
        """Language-model loss on a batch of demonstrations (InstructGPT's PPO-ptx)."""
        idx = torch.randint(len(self.ptx_data), (self.cfg.minibatch_size,), generator=generator)
        inputs, targets = self.ptx_data.batch(idx.tolist())
        device = next(self.actor.parameters()).device
        with self.amp():
            logits = self.actor(inputs.to(device))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten(),
                               ignore_index=IGNORE)

    def learn(self, generator=None) -> dict:
        """ppo_epochs over the replay buffer, then clear it."""
        cfg = self.cfg
        t0 = time.time()
        totals, n = {}, 0
        use_ptx = cfg.ptx_coef > 0 and self.ptx_data is not None
        stopped = False
        for epoch in range(cfg.ppo_epochs):
            for mb in self.buffer.minibatches(cfg.minibatch_size, generator):
                with self.amp():
                    logits, values = self.policy_and_values(mb.sequences, mb.attention_mask,
                                                            mb.prompt_len)
                responses = mb.sequences[:, mb.prompt_len:]
                logprobs, entropy = token_logprobs(logits, responses, with_entropy=True)
                pg_loss, clipfrac, approx_kl = policy_loss(
                    logprobs, mb.logprobs, mb.advantages, mb.action_mask, cfg.clip_range)
                if cfg.target_kl > 0 and approx_kl.item() > cfg.target_kl:
                    # the policy already moved this far from the one that sampled the batch:
                    # stop the update here, before this minibatch moves it further
                    stopped = True
                    break
                vf_loss = value_loss(values.float(), mb.values, mb.returns, mb.action_mask,
                                     cfg.clip_range_value)
                entropy = masked_mean(entropy, mb.action_mask)
                actor_loss = pg_loss - cfg.entropy_coef * entropy
                ptx = self.ptx_loss(generator) if use_ptx else torch.zeros(())
                if use_ptx:
                    actor_loss = actor_loss + cfg.ptx_coef * ptx
                if self.critic is None:  # shared trunk: one loss, one optimizer
                    self._step(self.actor_opt, actor_loss + cfg.vf_coef * vf_loss)
                else:
                    self._step(self.actor_opt, actor_loss)
                    self._step(self.critic_opt, vf_loss)
                figures = {"pg_loss": pg_loss, "vf_loss": vf_loss, "ptx_loss": ptx,
                           "clipfrac": clipfrac, "approx_kl": approx_kl,
                           "policy_entropy": entropy}
                for k, v in figures.items():
                    totals[k] = totals.get(k, 0.0) + v.item()
                n += 1
            if stopped:
                break
        self.buffer.clear()
        stats = {k: v / n for k, v in totals.items()}
        stats.update(minibatch_steps=n, skipped_updates=self.skipped_updates,
                     t_learn=time.time() - t0)
        return stats

    def _step(self, optimizer, loss):
        if not torch.isfinite(loss):
            # a runaway ratio or a degenerate batch: skip this update rather than write NaN
            # into the weights, and count it so the log shows it happened
            self.skipped_updates += 1
            return
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip, foreach=True)
        optimizer.step()

    # ------------------------------------------------------------------ one iteration
    def step(self, prompt_batches, generator=None) -> tuple[list[Experience], dict]:
        """Rollouts for each (prompt_ids, prompt_mask) batch, one update, KL coefficient update."""
        experiences, roll = [], []
        for ids, mask in prompt_batches:
            exp, stats = self.make_experience(ids, mask, generator)
            self.buffer.add(exp)
            experiences.append(exp)
            roll.append(stats)
        stats = {k: sum(s[k] for s in roll) / len(roll) for k in roll[0]}
        stats["t_generate"] = sum(s["t_generate"] for s in roll)
        stats["t_score"] = sum(s["t_score"] for s in roll)
        stats.update(self.learn(generator))
        n_samples = sum(len(e.scores) for e in experiences)
        self.kl_ctl.update(stats["kl"], n_samples)
        return experiences, stats
