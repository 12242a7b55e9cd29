"""On-policy distillation: the student samples, the teacher grades every token.

A student policy learns to write like a teacher policy (a larger or better-trained one, of the
same tokenizer). Off-policy, it would imitate the teacher's samples (SFT on them: `sample.py
--out` then `train_sft.py --data`). On-policy (Agarwal et al. 2024, "GKD"; Thinking Machines
2025, "On-policy distillation"), it samples its own responses and each of its tokens is graded
by how likely the teacher finds it:

    r_t = -(log pi_student(y_t | prefix) - log pi_teacher(y_t | prefix))

That is PPO's KL penalty in the reward (k1 per token, `ppo.kl_shaped_rewards`) with the teacher
in the reference's place, no score and a fixed coefficient of 1, so `--algo distill` is a
configuration of the trainer, not a trainer of its own: the teacher is loaded as the run's
reference, the reward function gives 0, beta is 1, and the policy-gradient losses learn from
those rewards. Every token carries a signal, where RL gives one number per response.

Two forms (`--distill_form`), each a row of the gradient oracle (lab/gradients.py):
- sequence (default): each response's summed reward, -(log pi(y) - log pi_teacher(y)), is its
  return (gamma 1), baselined by the other responses of its group (RLOO: unbiased). In
  expectation this is the gradient of -KL(pi || teacher) over whole responses: the reverse KL
  of the sequence, mode-seeking. No critic is needed: the reward is known at every token and
  the group gives the baseline for free.
- token: each token's own reward only (gamma 0, no baseline: the `per_token` advantages below),
  as Thinking Machines' write-up does. It follows the gradient of the per-prefix reverse KL with
  the chance of reaching each prefix held fixed: a token is not charged for the KL of the
  tokens its choice leads to. Lower variance, biased for sequences.

Forward KL or a generalised Jensen-Shannon divergence (GKD's) would need the teacher's whole
next-token distribution at every prefix the student visits, (B, N, V) numbers per rollout
where the trainer keeps (B, N) log-probs of the sampled tokens: a different experience record
and a different loss (on logits, not a policy gradient), so they are not entries here.

    python train_ppo.py --algo distill --teacher_dir out/ppo --sft_dir out/sft_small --out_dir out/distill
"""
from __future__ import annotations

import torch

from ..machinery.errors import UserError


def per_token_advantages(rewards, values, action_mask, spec, for_update):
    """The ADVANTAGES entry `per_token`: each token's own reward as its advantage (gamma 0, no
    baseline, no whitening): (rewards, advantages, returns) of (B, N) each."""
    return rewards, rewards * action_mask, torch.zeros_like(values)


class NoScore:
    """The reward function of a distillation run: no score (the teacher's log-probs, in the
    reference's place, are the whole reward), one 0 per response."""
    clipped = False

    def __call__(self, sequences, attention_mask, action_mask, **fields):
        return torch.zeros(len(sequences), device=sequences.device)

    def begin(self, where: str) -> None:
        pass

    def figures(self) -> dict:
        return {}


def load_teacher(cfg, tokenizer, device):
    """The teacher policy of `--teacher_dir`, frozen, on `device`: a model of its own (with
    LoRA the reference would be the student with its adapters off, which is no teacher). Its
    tokenizer must be the student's: the rewards compare the two models' log-probs of the same
    ids. A reward model's folder is refused (stages.load_policy)."""
    from ..stages import load_policy
    from ..tokenizer import same_tokenizer
    if not cfg.teacher_dir:
        raise UserError("--algo distill needs --teacher_dir, the folder of the teacher policy (a "
                        "PPO, GRPO, SFT or DPO run)")
    teacher, teacher_tokenizer, _ = load_policy(cfg.teacher_dir, flag="--teacher_dir", frozen=True)
    if not same_tokenizer(teacher_tokenizer, tokenizer):
        raise UserError(f"the teacher in {cfg.teacher_dir} has another tokenizer than the student "
                        f"(from {cfg.init_from or cfg.sft_dir}): distillation compares their "
                        f"log-probs of the same ids; pass a student and a teacher of one tokenizer")
    return teacher.to(device)
