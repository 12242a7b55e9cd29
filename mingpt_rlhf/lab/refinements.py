"""Refinements of GRPO and PPO published since GRPO, each a few lines on top of ppo.py.

Each is an option of train_ppo.py, off by default; each changes one thing:

1. **Clip-higher** (DAPO, Yu et al. 2025): PPO clips the ratio to [1 - eps, 1 + eps]. A token
   the policy rarely writes (p = 0.01) can then rise only to 0.012 per update while a likely
   one can fall just as far: the clip is harsher on raising unlikely tokens than on lowering
   likely ones, and the policy's entropy collapses. DAPO widens the upper side only:
   clip(ratio, 1 - eps_low, 1 + eps_high), eps_high 0.28 against eps_low 0.2
   (`--clip_range_high`; `ppo.policy_loss` takes it).

2. **A sequence-level ratio** (GSPO, Zheng et al. 2025): GRPO gives one advantage to a whole
   response but weighs each token by its own ratio, so a few tokens whose probability moved a
   lot decide the update. GSPO uses one ratio per response, the geometric mean of its tokens'
   ratios, s_i = exp(mean_t (log pi - log pi_old)), clips that per response (their clip range
   is small: about 3e-4 to 4e-4, since a mean of log-ratios moves little), and applies it to
   the response's advantage (`sequence_policy_loss`, `--ratio sequence`).

3. **Overlong reward shaping** (DAPO): a response cut off at the token budget gets a fixed
   penalty (`--missing_eos_penalty`), a cliff. DAPO puts a ramp before the cliff: within the
   last `buffer` tokens of the budget, the reward falls linearly, to -1 at the budget
   (`overlong_penalty`, `--overlong_buffer`), so the policy learns of the limit before it
   hits it.

4. **REINFORCE++** (Hu 2025): no critic and no groups; the KL to the reference is a per-token
   reward, as in PPO; a token's return is the sum of the rewards from it to the end,
   discounted by `--gamma` (1 by default; no value to bootstrap from); and the returns are
   normalised over the whole batch, not per group, which needs no group of samples per
   prompt (`reinforce_pp_advantages`, `--algo reinforce++`). PPO's clip is kept.

5. **Dynamic sampling** (DAPO): a group whose responses all got the same score (all right,
   or all wrong) has advantages of 0: it teaches nothing from the reward, yet it fills the
   batch and dilutes the update. DAPO drops such groups and samples more prompts until the
   batch is full of groups that carry a signal (`informative_groups`,
   `--dynamic_sampling N`: at most N more rollout batches per update, so a task the policy
   has solved cannot make an iteration sample forever; what is kept beyond the batch size
   is dropped, what is short is not made up).

6. **Truncated importance sampling** (Yao et al. 2025): the tokens were sampled by one
   computation of the policy (the KV-cached sampler) and PPO's ratio is taken against
   another (the full forward pass that scores the batch). In float32 the two agree to
   rounding and the sampler's numbers are reused; under bfloat16 they differ, and the update
   is slightly off-policy without knowing it. TIS weighs each token's loss by
   min(pi_learner / pi_sampler, C), the importance weight from the distribution that really
   sampled it, truncated at C so that one token cannot dominate (`--tis_cap C`). It is one
   entry of the table of off-policy corrections (lab/offpolicy.py, `--offpolicy`), beside the
   others for a sampler that lags the learner (`--sampler_lag N`). What it leaves
   uncorrected: the KL term when it is in the loss (`--kl_in loss`), the logged KL that
   drives the adaptive controller, and the truncation of top-k / top-p sampling (the
   sampler's log-probs are those of the full tempered distribution).

Every function here is checked against a hand computation in tests/test_refinements.py.
"""
from __future__ import annotations

import torch

from ..ppo import gae, masked_whiten, penalize_missing_eos, rollout_figures


def sequence_policy_loss(logprobs, old_logprobs, advantages, action_mask, clip_low: float,
                         clip_high: float):
    """GSPO's clipped surrogate with one ratio per sequence: (loss, clipfrac).

    logprobs, old_logprobs, action_mask: (B, N); advantages: (B,) one per sequence.
    s_i = exp(mean over i's tokens of (logprobs - old_logprobs));
    loss_i = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)); loss = mean over i.
    clipfrac is the share of sequences whose clipped branch was taken."""
    tokens = action_mask.sum(-1).clamp(min=1)
    log_ratio = (logprobs - old_logprobs) * action_mask
    seq_ratio = torch.exp(log_ratio.sum(-1) / tokens)                            # (B,)
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_low, 1 + clip_high)
    loss = torch.max(unclipped, clipped).mean()
    with torch.no_grad():
        clipfrac = (clipped > unclipped).float().mean()
    return loss, clipfrac


def overlong_penalty(lengths: torch.Tensor, budget: int, buffer: int) -> torch.Tensor:
    """(B,) DAPO's soft penalty for responses of `lengths` tokens under a budget of `budget`:
    0 up to budget - buffer tokens, then falling linearly to -1 at the budget:
    -(length - (budget - buffer)) / buffer, clamped to [-1, 0]. `buffer` 0: no penalty."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    over = (lengths.float() - (budget - buffer)) / buffer
    return -over.clamp(0, 1)


def overlong_shaped(scores, ended, lengths, cfg):
    """(B,) scores with the missing-EOS penalty and DAPO's ramp before it: a response that
    ended within cfg.overlong_buffer tokens of the budget loses up to 1 (`overlong_penalty`)."""
    scores = penalize_missing_eos(scores, ended, lengths, cfg)
    return scores + torch.where(ended, overlong_penalty(lengths, cfg.max_new_tokens,
                                                        cfg.overlong_buffer), 0.0)


def reinforce_pp_advantages(rewards: torch.Tensor, action_mask: torch.Tensor,
                            gamma: float = 1.0, all_ranks: bool = False) -> torch.Tensor:
    """(B, N) REINFORCE++ advantages: each token's return, the sum of the (KL-shaped) rewards
    from it to the end of its response, each discounted by gamma per token it lies ahead,
    then whitened over every real token of the batch. That is GAE with no critic (values 0)
    and lambda 1."""
    returns, _ = gae(rewards, torch.zeros_like(rewards), action_mask, gamma=gamma, lam=1.0)
    return masked_whiten(returns, action_mask, all_ranks=all_ranks)


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Row indices of the groups (rows g*k .. g*k + k - 1) whose scores are not all equal:
    DAPO's dynamic sampling keeps these and drops the rest."""
    g = scores.view(-1, group_size)
    keep = g.max(-1).values != g.min(-1).values                                 # (G,)
    rows = torch.arange(len(scores), device=scores.device).view(-1, group_size)
    return rows[keep].flatten()


def collect_informative(trainer, prompt_batches, sample_gen, refill):
    """DAPO's dynamic sampling as the trainer's collection (ppo_trainer.collect_all's place):
    of each rollout only the groups that carry a signal go to the replay buffer, up to the
    rows the batches would have given, and while the update has fewer, `refill()` gives one
    more batch, at most `--dynamic_sampling` of them. Figures: rollouts, kept_rows and
    dropped_groups (the share of groups left out for want of a signal)."""
    k = trainer.cfg.group_size
    wanted = sum(len(b if trainer.episodes is not None else b[0]) for b in prompt_batches)
    pending, experiences, rolled, kept, groups, dropped = list(prompt_batches), [], [], 0, 0, 0
    while pending:
        exp, stats = trainer.rollout(pending.pop(0), sample_gen)
        experiences.append(exp)
        rolled.append(stats)
        rows = informative_groups(exp.scores, k)
        groups += len(exp.scores) // k
        dropped += (len(exp.scores) - len(rows)) // k  # no signal only
        exp = exp.select(rows[:wanted - kept])  # groups beyond the batch: not learned
        if not pending and kept + len(rows) < wanted \
                and len(rolled) < len(prompt_batches) + trainer.cfg.dynamic_sampling:
            pending.append(refill())
        if len(exp.scores):
            trainer.buffer.add(exp)
            kept += len(exp.scores)
    stats = rollout_figures(rolled)
    stats.update(rollouts=len(rolled), kept_rows=kept, dropped_groups=dropped / groups)
    return experiences, stats
