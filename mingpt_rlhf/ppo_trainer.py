"""One PPO iteration for a language model: make experience, then learn from it.

    make_experience: prompts -> actor samples -> log-probs (actor, reference) -> values
                     -> reward-model scores -> KL-shaped rewards -> GAE -> Experience
    learn:           ppo_epochs x shuffled minibatches of the replay buffer
                     -> clipped policy loss (+ ptx, - entropy bonus) -> clipped value loss
                     -> early stop when a minibatch's approx-KL passes target_kl

The formulas are ppo.py's and losses.py's (one call per role). Every other method, and the
machinery a run may add (slices, a lagging sampler, episodes), is chosen once in `__init__`:
the iteration never asks which (docs/methods.md, "Where a variant plugs in"). Two random
generators, as they live on different devices: `sample_gen` draws tokens on the model's,
`shuffle_gen` orders the minibatches on the CPU. Why the sampler's log-probs serve as the
old policy's in float32: docs/methods.md, "Why the ratio is still right".
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import torch
import torch.nn.functional as F

from .machinery.distributed import all_agree, mean_over_ranks, token_share, tokens_per_rank, world_size
from .logprobs import input_mask, lm_logprobs, lm_loss_of_hidden
from .decode_graphs import DecodeGraphs
from .machinery.lora import adapters_disabled, has_lora
from .losses import (GROUP_BASELINES, ROLLOUT_FIGURES, ROWS_TO_LEARN, SCORE_SHAPING, actor_loss,
                     advantages_of, aliases_of, check_roles, check_groups, default_kl_estimator,
                     every_row, experience_advantages, no_rollout_figures, policy_loss_of,
                     score_shaping_of, spec_of)
from .optim import Optimizer
from .ppo import (Experience, ReplayBuffer, last_action_index, masked_mean,
                  rollout_figures, value_loss)
from .lab.offpolicy import READS_CAP, Correction, SamplerQueue, cap_of, correct, resolved_offpolicy
from .lab.refinements import collect_informative
from .sampling import GenerationOutput, generate


def trainable(module) -> list:
    return [p for p in module.parameters() if p.requires_grad]


class CurrentWeights:
    """The sampler of every rollout is the actor as it is (PPO is on-policy). A lagging
    sampler (offpolicy.SamplerQueue, --sampler_lag) takes its place with the same calls."""

    def sampling(self, actor, for_update: bool):
        return contextlib.nullcontext()

    def push(self, params) -> None:
        pass

    def state(self) -> list:
        return []

    def load(self, copies, shapes) -> bool:
        return not copies  # a lagging sampler's weights belong to a run with a lag


def same_policy(learner, sampler, action_mask):
    """((old log-probs, weights), figures) where the sampler's log-probs are the learner's:
    the ratio against the learner's own, no weight, nothing to measure (else
    `against_sampler`, whose off-policy corrections return a named Correction)."""
    return (learner, 1.0), {}


def resolve_auto_options(cfg):
    """A copy of `cfg` with every "auto" option replaced by its value, so that any caller of
    PPOTrainer (train_ppo.py, a benchmark, your script) trains with the same values:

    - actor_lr -1: 1e-4 with the task's own check (`cfg.reward == "task"`, docs/rewards.md
      measured both rates) or an environment's rewards (`"env"`), else 5e-5 (a reward model, a
      user's function);
    - ptx_coef -1: 0.02 for ppo, 0 for grpo and rloo and with an environment;
    - kl_in "auto": "loss" with GRPO's std normalisation (the paper's pairing) and for ppo,
      grpo and rloo with an environment, else "reward". Why episodes: a policy that has turned
      (nearly) deterministic, onto the empty answer or onto wrong moves, is not pulled back by
      a KL in the reward: in a group whose episodes all end alike every advantage is 0, and a
      token the policy is sure of has a vanishing policy gradient whatever its advantage; the
      KL's gradient in the loss does not go through the advantages (docs/troubleshooting.md);
    - kl_coef -1: 0.2 for grpo and rloo with an environment, else 0.05. Why: at 0.05 their
      runs of a game could settle on moves that ignore what decides it (the corridor's door);
      the larger pull towards the reference keeps both moves sampled long enough to learn it
      (docs/multiturn.md measured both);
    - kl_estimator "auto": k3 with the KL in the loss (the GRPO paper's), k1 in the reward;
    - distill: the KL (to the teacher) in the reward, k1 (its beta of 1 is the script's
      controller: methods/distill.py), actor_lr 1e-4;
    - advantages and policy_loss "auto": the method's entries (losses.advantages_of,
      losses.policy_loss_of; --offpolicy gspo: GSPO's ratio, taken against the sampler), and
      --ratio and --cov_loss set to agree with the policy loss (losses.aliases_of);
    - reduction "auto": the advantage entry's: token for gae and reinforce++, sequence for
      grpo (with the std), budget for dr_grpo and rloo; and
      sequence with one ratio per response (`ratio == "sequence"`, GSPO), whose loss is a mean
      over responses whatever the reduction says (the KL in the loss then follows it).

    Refuses (ValueError) an entry the method cannot feed (losses.check_roles); the std
    normalisation with the KL in the reward: in a group whose
    scores are all equal the rewards differ only by beta x KL, and dividing by their std
    would blow that noise up to advantages of +-1; GSPO with another reduction than its own;
    and GSPO's ratio with a correction that weighs each token (offpolicy.READS_CAP): its one
    ratio per response would take the mean of the weights, which is no importance weight
    (losses._sequence_ratio says why)."""
    algo = cfg.algo
    check_roles(cfg)
    adv, loss = advantages_of(cfg), policy_loss_of(cfg)
    std = adv == "grpo"  # GRPO's division by the group's reward std
    gspo = loss == "sequence"
    # episodes with an environment: --env set (check_config then sets --reward env too; a
    # library caller's Config may not)
    episodes = bool(getattr(cfg, "env", "")) or getattr(cfg, "reward", "rm") == "env"
    roles = {"advantages": adv, "policy_loss": loss, **aliases_of(loss)}
    auto = {name: value for name, value in roles.items() if hasattr(cfg, name)}
    if cfg.actor_lr == -1:
        dense = episodes or algo == "distill" or getattr(cfg, "reward", "rm") == "task"
        auto["actor_lr"] = 1e-4 if dense else 5e-5
    if cfg.ptx_coef == -1:  # episodes have no demonstrations of the task's kind to mix in
        auto["ptx_coef"] = 0.02 if algo == "ppo" and not episodes else 0.0
    if cfg.kl_in == "auto":
        in_loss = std or (episodes and algo in ("ppo", "grpo", "rloo"))
        auto["kl_in"] = "loss" if in_loss else "reward"
    if getattr(cfg, "kl_coef", None) == -1:  # (a caller's cfg may not have it)
        auto["kl_coef"] = 0.2 if episodes and algo in ("grpo", "rloo") else 0.05
    if getattr(cfg, "kl_estimator", None) == "auto":  # (a caller's cfg may not have it)
        auto["kl_estimator"] = default_kl_estimator(auto.get("kl_in", cfg.kl_in))
    if cfg.reduction == "auto":
        # the advantage estimator's own (online DPO's loss is a mean over pairs: unused)
        auto["reduction"] = "sequence" if gspo else {
            "grpo": "sequence", "dr_grpo": "budget", "rloo": "budget", "preference": "sequence",
            "distill": "budget", "distill_token": "budget"}.get(adv, "token")
    elif gspo and cfg.reduction != "sequence":
        raise ValueError(f"--ratio sequence (GSPO) has its own reduction, a mean over responses; "
                         f"drop --reduction {cfg.reduction} (or pass --reduction sequence)")
    if gspo and resolved_offpolicy(cfg) in READS_CAP:
        weighing = (f"--offpolicy {cfg.offpolicy}" if getattr(cfg, "offpolicy", "auto") != "auto"
                    else "--tis_cap (--offpolicy auto: tis)")
        raise ValueError(f"--ratio sequence (GSPO) takes one ratio per response, and {weighing} "
                         f"weighs each token: a response would be weighed by the mean of its "
                         f"tokens' weights, which is not its importance weight (their product, "
                         f"docs/offpolicy.md); use --offpolicy gspo or clip (the ratio against "
                         f"the sampler), or --ratio token")
    if algo == "distill":  # the teacher's log-probs, k1 in the reward (at beta 1), are the reward
        auto.update({"kl_in": "reward", **({"kl_estimator": "k1"} if hasattr(cfg, "kl_estimator") else {})})
    cfg = dataclasses.replace(cfg, **auto) if auto else cfg
    if std and cfg.kl_in == "reward":
        raise ValueError("--grpo_norm grpo (GRPO's advantages) divides by the group's reward "
                         "std: with the KL in the reward, a group of equal scores would get its "
                         "KL noise scaled to "
                         "+-1 advantages; use --kl_in loss (the paper's pairing, the default "
                         "with --grpo_norm grpo) or --grpo_norm dr")
    return cfg


class PPOTrainer:
    def __init__(self, cfg, actor, ref, reward_fn, critic=None, value_head=None,
                 eos_id: int | None = 1, pad_id: int = 0, kl_ctl=None, ptx_data=None,
                 amp=contextlib.nullcontext, dtype: torch.dtype = torch.float32, episodes=None):
        """`cfg` holds the PPO options (see train_ppo.Config). Give `critic` (separate) or
        `value_head` (shared: a heads.ScalarHead on the actor's trunk, float32), not both.
        `ref=None` with a LoRA actor: the reference is the actor with its adapters off.
        `reward_fn(sequences, attention_mask, action_mask, **fields) -> (B,)` raw scores,
        called once per rollout batch, outside `amp()` (rewards.py: the reward model, the
        task's check, a user function); its scores are clipped to +-`cfg.reward_clip` unless
        it says `clipped = False` (a reward from code).
        `amp()` gives the mixed-precision context for forward passes. It must not span an
        optimizer step: autocast caches low-precision copies of the weights for as long as
        it is open, and they would go stale after the update. `dtype` is autocast's dtype
        (float16 turns on loss scaling). `episodes` (episodes.EpisodeSource): roll out
        episodes with an environment instead of single turns (`play`); `reward_fn` is then
        unused (the environment gives the rewards)."""
        cfg = resolve_auto_options(cfg)
        if cfg.actor_lr <= 0 or cfg.ptx_coef < 0:  # a sentinel no one resolved, or a typo
            raise ValueError(f"actor_lr must be > 0 and ptx_coef >= 0 (or -1 for auto), got "
                             f"{cfg.actor_lr} and {cfg.ptx_coef}")
        if cfg.algo == "online_dpo" and getattr(cfg, "learn_batch_size", 0):
            # its loss is a mean over the pairs that carry a preference, and a slice knows only
            # its own count of them: slices holding different counts would weigh their pairs
            # unevenly, and the summed gradients would not be the whole minibatch's
            raise ValueError(f"online_dpo learns each minibatch whole: learn_batch_size must be "
                             f"0, got {cfg.learn_batch_size}")
        if cfg.algo == "ppo":
            assert (critic is None) != (value_head is None), "give a critic or a value head"
        elif cfg.algo == "reinforce++":
            assert critic is None and value_head is None, "reinforce++ has no critic"
        else:
            assert critic is None and value_head is None, f"{cfg.algo} has no critic"
        assert ref is not None or has_lora(actor), "ref=None needs a LoRA actor"
        self.cfg, self.actor, self.ref, self.reward_fn = cfg, actor, ref, reward_fn
        # the entry of each role of losses.py this run uses (advantages, policy loss, ...)
        self.spec = spec_of(cfg)
        self.rollout_figures = ROLLOUT_FIGURES.get(self.spec.advantages, no_rollout_figures)
        self.critic, self.value_head = critic, value_head
        self.eos_id, self.pad_id = eos_id, pad_id
        # a PAD of its own is never sampled, so its probability is 0 in the log-probs too
        self.suppress = pad_id if pad_id != eos_id else None
        self.kl_ctl, self.ptx_data, self.amp = kl_ctl, ptx_data, amp
        self.use_ptx = cfg.ptx_coef > 0 and ptx_data is not None
        device = next(actor.parameters()).device
        # a shared value head learns at critic_lr in the actor's optimizer (its own group)
        groups = [{"params": trainable(actor), "lr": cfg.actor_lr, "weight_decay": 0.0}]
        if value_head is not None:
            groups.append({"params": trainable(value_head), "lr": cfg.critic_lr, "weight_decay": 0.0})
        self.actor_opt = Optimizer(groups, dtype, device, cfg.grad_clip)
        self.critic_opt = (Optimizer([{"params": trainable(critic), "lr": cfg.critic_lr,
                                       "weight_decay": 0.0}], dtype, device, cfg.grad_clip)
                           if critic is not None else None)
        self.buffer = ReplayBuffer(pad_id)
        # in float32 the sampler's log-probs are the scoring pass's to rounding, so that pass
        # is skipped; under autocast they differ by low-precision noise (module docstring)
        self.reuse_sampler_logprobs = dtype == torch.float32 and not getattr(cfg, "sampler_lag", 0)
        # the weights that sample: the actor's own (PPO is on-policy), or with --sampler_lag N
        # its trainable weights of N updates ago, swapped in to sample (offpolicy.SamplerQueue);
        # the sampler's log-probs are then kept beside the scoring pass's, and the run's
        # off-policy correction (--offpolicy) decides what the ratio is taken against and how
        # each token is weighed
        self.sampler_lag = getattr(cfg, "sampler_lag", 0)
        self.queue = SamplerQueue(self.sampler_lag) if self.sampler_lag else CurrentWeights()
        self.offpolicy = resolved_offpolicy(cfg)
        # whether the sampler keeps its log-probs: to reuse them as the learner's (float32, no
        # lag), or to keep them beside the learner's (a lagging or low-precision sampler)
        self.sampler_scores = (self.reuse_sampler_logprobs or self.offpolicy != "none"
                               or self.sampler_lag > 0)
        self.is_cap = cap_of(cfg)
        self.episodes = episodes
        # what a variant changes in the iteration, chosen here once (PPO's own by default):
        # how rollouts are collected (dynamic sampling: lab/refinements.py), where one comes from
        # (an environment: methods/episodes.py), which of its rows learn and in what units (online
        # DPO's pairs: losses.ROWS_TO_LEARN)
        self.collect = collect_informative if getattr(cfg, "dynamic_sampling", 0) else collect_all
        if episodes is not None:
            self.rollout = self.play_rollout
        if cfg.generate_batch_size:  # the KV cache of fewer rows at a time
            self.sample = self.sample_in_slices
        # the decoding loop: sampling.py's, or on CUDA a step of fixed shapes replayed as a CUDA
        # graph (--decode_graphs, decode_graphs.py)
        self.generate = generate
        if getattr(cfg, "decode_graphs", False) and device.type == "cuda":
            self.generate = functools.partial(generate, loop=DecodeGraphs())
        if getattr(cfg, "learn_batch_size", 0):  # the activations of fewer rows at a time
            self.slices = self.slices_of_size
        if value_head is not None:  # the critic: separate (PPO's default), shared, or none
            self.values_of, self.value_loss_in_actor = self.head_values, self.shared_value_loss
        if critic is None:
            self.critic_step = self.no_critic_step
            if value_head is None:
                self.values_of = self.no_values
        rows, self.unit = ROWS_TO_LEARN.get(self.spec.policy_loss, (every_row, 1))
        self.shape_scores = SCORE_SHAPING[score_shaping_of(cfg)]
        if self.reuse_sampler_logprobs or not self.sampler_scores:  # nothing to correct
            self.against_sampler = same_policy
        self.rows_to_learn = functools.partial(rows, group_size=getattr(cfg, "group_size", 2))
        # the generation budget of a rollout (Dr. GRPO's "budget" reduction divides by it):
        # a response's max_new_tokens, or every turn's of an episode
        self.budget = cfg.max_new_tokens * (episodes.max_turns if episodes is not None else 1)

    def set_lr_scale(self, scale: float) -> None:
        """Every learning rate (actor, critic, value head) at its peak x `scale`."""
        self.actor_opt.set_lr_scale(scale)
        if self.critic_opt is not None:
            self.critic_opt.set_lr_scale(scale)

    # ------------------------------------------------------------------ forward passes
    def policy_and_values(self, sequences, attention_mask, T: int, entropy: str | None = None,
                          with_values: bool = True, ptx=None):
        """Log-probs (B, N) of the response tokens under the actor, their entropy (or None)
        and the values (B, N) (None when `with_values` is False and the critic is separate), each
        column from the hidden state *before* its token (position T - 1 + i). `ptx` = (inputs,
        targets): demonstrations in the same trunk pass, whose LM loss is returned fourth."""
        rows, S = sequences.shape
        if ptx is None:
            hidden = self.actor.trunk(sequences, attention_mask)
        else:
            inputs, targets = ptx
            width = max(S, inputs.size(1))

            def right(x, fill=0):  # (B, w) -> (B, width)
                return F.pad(x, (0, width - x.size(1)), value=fill)
            hidden = self.actor.trunk(
                torch.cat([right(sequences, self.pad_id), right(inputs, self.pad_id)]),
                torch.cat([right(attention_mask), right(input_mask(targets).long())]))
            ptx_loss = lm_loss_of_hidden(self.actor, hidden[rows:, :inputs.size(1)], targets,
                                         self.suppress)
            hidden = hidden[:rows, :S]
        hidden = hidden[:, T - 1:-1]                                     # (B, N, C)
        logprobs, ent = lm_logprobs(self.actor, hidden, sequences[:, T:], self.cfg.temperature,
                                    self.suppress, entropy)
        values = self.values_of(hidden, sequences, attention_mask, T, with_values)
        return (logprobs, ent, values) if ptx is None else (logprobs, ent, values, ptx_loss)

    def critic_values(self, sequences, attention_mask, T: int):
        """(B, N) values of the separate critic at the positions before each response token."""
        return self.critic(sequences, attention_mask)[:, T - 1:-1]

    def values_of(self, hidden, sequences, attention_mask, T: int, wanted: bool = True):
        """The separate critic's values (B, N) if `wanted` (not in the learning pass: that
        critic learns in `critic_step`). `__init__` swaps in `head_values` or `no_values`."""
        return self.critic_values(sequences, attention_mask, T) if wanted else None

    def head_values(self, hidden, sequences, attention_mask, T: int, wanted: bool = True):
        """`values_of` with a shared value head: read from the actor's hidden states (B, N, C),
        in every pass (the learning pass's feed its value loss)."""
        return self.value_head(hidden).squeeze(-1)

    @staticmethod
    def no_values(hidden, sequences, attention_mask, T: int, wanted: bool = True):
        return None  # critic-free (GRPO, RLOO, ...): experience_from puts zeros

    def ref_logprobs(self, sequences, attention_mask, T: int):
        """(B, N) log-probs of the response tokens under the frozen reference."""
        model = self.ref if self.ref is not None else self.actor
        with adapters_disabled(model) if self.ref is None else contextlib.nullcontext():
            hidden = model.trunk(sequences, attention_mask)[:, T - 1:-1]
            return lm_logprobs(model, hidden, sequences[:, T:], self.cfg.temperature,
                               self.suppress)[0]

    def sample(self, prompt_ids, prompt_mask, generator=None, score: bool = False) -> GenerationOutput:
        """Responses to a batch of prompts (sequences and masks (B, T + N); with `score`, the
        sampler's log-probs, entropies and hidden states too)."""
        cfg = self.cfg
        with self.amp():
            return self.generate(self.actor, prompt_ids, prompt_mask, cfg.max_new_tokens,
                                 temperature=cfg.temperature, top_k=cfg.top_k or None,
                                 top_p=cfg.top_p if cfg.top_p < 1 else None, eos_token_id=self.eos_id,
                                 pad_token_id=self.pad_id, generator=generator, score=score)

    def sample_in_slices(self, prompt_ids, prompt_mask, generator=None,
                         score: bool = False) -> GenerationOutput:
        """`sample` on `cfg.generate_batch_size` rows at a time (its KV cache is the largest
        tensor of the rollout: layers x 2 x rows x length x width), the slices right-padded to
        the longest response."""
        step = self.cfg.generate_batch_size
        outs = [PPOTrainer.sample(self, prompt_ids[i:i + step], prompt_mask[i:i + step],
                                  generator, score)
                for i in range(0, len(prompt_ids), step)]
        if len(outs) == 1:
            return outs[0]
        new = max(o.sequences.size(1) for o in outs) - prompt_ids.size(1)

        def cat(name, fill=0):  # right-pad each slice's response columns to `new`
            parts = [getattr(o, name) for o in outs]
            if parts[0] is None:
                return None
            short = [new - o.sequences.size(1) + o.prompt_len for o in outs]
            # (B, T + n) and (B, n) pad their last dim, (B, n, C) its middle one
            return torch.cat([F.pad(x, (0, 0, 0, k) if x.dim() == 3 else (0, k), value=fill)
                              for x, k in zip(parts, short)])
        pad = self.pad_id if self.pad_id is not None else 0
        return GenerationOutput(cat("sequences", pad), cat("attention_mask"), cat("action_mask"),
                                prompt_ids.size(1), cat("logprobs"), cat("entropy"), cat("hidden"))

    @torch.no_grad()
    def make_experience(self, prompt_ids, prompt_mask, generator=None, for_update: bool = True,
                        fields: dict | None = None) -> tuple[Experience, dict]:
        """One rollout batch: sample, score with the reward function (once, on the whole
        batch; `fields` name -> one value per row go to it), shape and place the scores, then
        `experience_from`. An eval batch (`for_update=False`) gets no advantages."""
        cfg = self.cfg
        t0 = time.time()
        with self.queue.sampling(self.actor, for_update):
            out = self.sample(prompt_ids, prompt_mask, generator,
                              score=self.sampler_scores)
        t1 = time.time()
        T = prompt_ids.size(1)
        responses = out.sequences[:, T:]                                # (B, N)
        action_mask = out.action_mask[:, T:].float()                    # (B, N)
        # one call per rollout batch, outside the policy's autocast (the RM applies its own)
        raw = self.reward_fn(out.sequences, out.attention_mask, action_mask,
                             **(fields or {})).float()
        scores = raw
        # a reward model's scores are normalised: +-reward_clip cuts only outliers
        if cfg.reward_clip > 0 and getattr(self.reward_fn, "clipped", True):
            scores = raw.clamp(-cfg.reward_clip, cfg.reward_clip)
        ended = (((responses == self.eos_id) & action_mask.bool()).any(-1) if self.eos_id is not None
                 else torch.ones_like(scores, dtype=torch.bool))  # (a task without EOS)
        # a response cut off by max_new_tokens gets a fixed penalty instead of the RM's
        # opinion of a half-written text (losses.SCORE_SHAPING)
        scores = self.shape_scores(scores, ended, action_mask.sum(-1), cfg)
        # the score lands on the last action: a single turn is the episode of one turn
        placed = torch.zeros_like(action_mask)
        placed[torch.arange(len(scores)), last_action_index(action_mask)] = scores
        return self.experience_from(out, action_mask, placed, raw, ended, prompt_ids,
                                    for_update, t1 - t0, t1)

    @torch.no_grad()
    def play(self, seeds: list[int], generator=None, for_update: bool = True):
        """One rollout batch of episodes with the environment, one per seed (methods/episodes.py),
        then `experience_from`: (Experience, stats, Episodes). GRPO / RLOO batches hold groups
        of `group_size` episodes with the same seed. The environment's tokens are masked out of
        every loss (unless `episodes.mask_env` is False, which exists to show what the mask is
        for), and each step's reward sits on its turn's last action."""
        cfg, source = self.cfg, self.episodes
        t0 = time.time()
        # the sampler's log-probs serve when only the actions need them; unmasked
        # environment tokens were never sampled, so the scoring pass computes theirs
        score = self.sampler_scores and source.mask_env
        with self.queue.sampling(self.actor, for_update), self.amp():  # weights swapped before autocast caches them
            ep = source.play(self.actor, seeds, cfg, generator, score)
        t1 = time.time()
        T = ep.prompt_len
        action_mask = (ep.action_mask if source.mask_env else ep.attention_mask)[:, T:].float()
        keys = torch.tensor(seeds, device=ep.sequences.device)[:, None]  # a group's seed
        exp, stats = self.experience_from(ep, action_mask, ep.rewards, ep.returns, ep.done, keys,
                                          for_update, t1 - t0, t1)
        stats["turns"] = ep.turns.float().mean().item()
        return exp, stats, ep

    def experience_from(self, out: GenerationOutput, action_mask, placed, raw, ended, group_keys,
                        for_update: bool, t_generate: float, t_scored: float) -> tuple[Experience, dict]:
        """Experience from a sampled batch: the scoring passes (actor, reference, critic), the
        KL, the advantages and the rollout's figures. `out` has the sequences (B, T + N) and the
        sampler's log-probs when it kept them; `action_mask` (B, N) the tokens the policy chose;
        `placed` (B, N) the rewards where they land; `raw` (B,) the reward before clipping; `ended`
        (B,) whether each ended with EOS; `group_keys` what each row started from."""
        cfg = self.cfg
        seqs, attn, T = out.sequences, out.attention_mask, out.prompt_len
        # score score_batch_size rows at a time (default: minibatch_size), not the whole batch
        parts = []
        rows_per_pass = cfg.score_batch_size or cfg.minibatch_size
        reuse = out.logprobs is not None and self.reuse_sampler_logprobs
        for i in range(0, len(seqs), rows_per_pass):
            rows = slice(i, i + rows_per_pass)
            with self.amp():
                if reuse:  # the sampler's own (docs/methods.md, "Why the ratio is still right")
                    lp, ent = out.logprobs[rows], out.entropy[rows]
                    val = self.values_of(out.hidden[rows], seqs[rows], attn[rows], T)
                else:
                    lp, ent, val = self.policy_and_values(seqs[rows], attn[rows], T, "value")
                ref_lp = self.ref_logprobs(seqs[rows], attn[rows], T)
            val = val.float() if val is not None else torch.zeros_like(lp)  # critic-free
            parts.append((lp, ent, val, ref_lp))
        logprobs, entropy, values, ref_logprobs = (torch.cat(x) for x in zip(*parts))
        logprobs, ref_logprobs, values = (x * action_mask for x in (logprobs, ref_logprobs, values))
        scores = placed.sum(-1)                                         # (B,) the return

        kl_coef = self.kl_ctl.value
        kl_per_seq = ((logprobs - ref_logprobs) * action_mask).sum(-1)  # sum over actions
        # the ratio's denominator and each token's weight: the learner's own log-probs
        (old_logprobs, weights), mismatch = self.against_sampler(logprobs, out.logprobs,
                                                                 action_mask)
        # the KL penalty in the reward, then GAE and whitening: losses.py, one call
        rewards, advantages, returns = experience_advantages(
            placed, logprobs, ref_logprobs, values, action_mask, self.spec, kl_coef, for_update, weights,
            entropy)
        exp = Experience(seqs, attn, action_mask, old_logprobs, ref_logprobs, values, rewards,
                         advantages, returns, scores, start_logprobs=logprobs)

        stats = {"rm_score": raw.mean().item(), "score": scores.mean().item(),
                 "kl": kl_per_seq.mean().item(), "kl_coef": kl_coef,
                 "entropy": masked_mean(entropy, action_mask).item(),
                 "resp_len": action_mask.sum(-1).mean().item(),
                 "gen_tokens": action_mask.sum().item(),  # generated tokens, summed (the cost)
                 "eos_rate": ended.float().mean().item(),
                 "t_generate": t_generate, "t_score": time.time() - t_scored, **mismatch}
        # the advantage entry's own figures (gae: the critic's explained variance)
        stats.update(self.rollout_figures(scores, values, returns, action_mask, group_keys,
                                          self.spec, for_update))
        return exp, stats

    def against_sampler(self, logprobs, sampler_logprobs, action_mask):
        """(Correction, figures) of a rollout whose sampler's log-probs (B, N) are not the
        learner's (a lagging sampler, or low precision with --offpolicy): the run's entry of
        offpolicy.OFFPOLICY. Where they are the same, `__init__` puts offpolicy.same_policy
        here instead."""
        (old, weights), figures = correct(self.offpolicy, logprobs,
                                          sampler_logprobs.float() * action_mask, action_mask,
                                          self.is_cap)
        return Correction(old, 1.0 if weights is None else weights), figures

    def group_baselined(self, rewards, prompts):
        """(B,) advantages of GRPO / Dr. GRPO / RLOO from (B,) sequence rewards, by the
        run's entry of losses.GROUP_BASELINES; `prompts` as losses.check_groups."""
        check_groups(prompts, self.cfg.group_size)
        return GROUP_BASELINES[self.spec.advantages](rewards, self.cfg.group_size)

    # ------------------------------------------------------------------ learning
    def ptx_batch(self, generator=None):
        """InstructGPT's ptx batch of demonstrations, (inputs, targets) on the model's device."""
        idx = torch.randint(len(self.ptx_data), (self.cfg.minibatch_size,), generator=generator)
        inputs, targets = self.ptx_data.batch(idx.tolist())
        device = next(self.actor.parameters()).device
        return inputs.to(device), targets.to(device)

    def learn(self, generator=None) -> dict:
        """ppo_epochs over the replay buffer, then clear it; each minibatch one optimizer step.
        The figures: means over every minibatch whose loss was computed (the stopping one too);
        `minibatch_steps` counts the steps, `early_stop_kl` is the approx-KL that stopped it."""
        cfg = self.cfg
        t0 = time.time()
        totals, counts, steps, stop_kl = {}, {}, 0, 0.0
        self.first_minibatch = None  # (the rows watch.largest_logratio reads after the update)
        epochs = (mb for _ in range(cfg.ppo_epochs)  # each epoch: the buffer shuffled anew
                  for mb in self.buffer.minibatches(cfg.minibatch_size, generator, self.unit))
        for mb in epochs:
            self.first_minibatch = self.first_minibatch or mb
            figures, stepped, stop_kl = self._learn_minibatch(mb, generator)
            for k, v in figures.items():  # summed as tensors: no host sync per figure
                totals[k] = totals.get(k, 0.0) + v.detach().float()
                counts[k] = counts.get(k, 0) + 1  # (a stopped minibatch has no vf_loss)
            steps += stepped
            if stop_kl:
                break
        self.buffer.clear()  # (dynamic sampling may have kept nothing: no minibatch at all)
        stats = {k: v.item() / counts[k] for k, v in totals.items()}
        stats.update(minibatch_steps=steps, early_stop_kl=stop_kl,
                     skipped_updates=self.skipped_updates, t_learn=time.time() - t0)
        return stats

    def slices(self, mb: Experience) -> list[Experience]:
        """The minibatch as the passes of one step: itself, one pass. (With
        `cfg.learn_batch_size`, `__init__` puts `slices_of_size` here.)"""
        return [mb]

    def slices_of_size(self, mb: Experience) -> list[Experience]:
        """`slices` with `cfg.learn_batch_size`: k equal slices of that many rows (trimmed of
        their own padding). Each slice's loss is divided by k and every token mean divides by
        the whole minibatch's count / k, as torchrun's processes do (distributed.tokens_per_rank):
        the gradients summed over the slices are the whole minibatch's, and only one slice's
        activations are alive at a time. A minibatch that the size does not divide (the last of
        an epoch) is one pass."""
        size = self.cfg.learn_batch_size
        rows = len(mb.scores)
        if size >= rows or rows % size:
            return [mb]
        return [mb.select(torch.arange(i, i + size, device=mb.scores.device)).trimmed()
                for i in range(0, rows, size)]

    def _learn_minibatch(self, mb: Experience, generator=None) -> tuple[dict, bool, float]:
        """One step of the actor (and one of the critic) on a minibatch, forward and backward
        over its `slices`. Returns the figures, whether the actor stepped, and the approx-KL that
        stopped the update here (0.0 when none did): past cfg.target_kl no step is taken."""
        cfg = self.cfg
        parts = self.slices(mb)
        k = len(parts)
        tokens = tokens_per_rank(mb.action_mask) / k  # what a token mean divides by
        figures, finite = {"ptx_loss": torch.zeros(())}, True
        for i, part in enumerate(parts):
            # the ptx batch rides with the first slice, in the same forward and backward
            ptx = self.ptx_batch(generator) if self.use_ptx and i == 0 else None
            with self.amp():
                logprobs, entropy, values, *ptx_loss = self.policy_and_values(
                    part.sequences, part.attention_mask, part.prompt_len,
                    "grad" if cfg.entropy_coef > 0 else "value", with_values=False, ptx=ptx)
            # the surrogate - the entropy bonus (+ the KL, in the loss): losses.py
            loss, part_figures = actor_loss(
                logprobs, entropy, part.logprobs, part.ref_logprobs, part.advantages,
                part.action_mask, self.spec, self.kl_ctl.value, self.budget, tokens,
                part.start_logprobs)
            loss = loss + self.value_loss_in_actor(values, part, tokens, part_figures)
            if ptx_loss:  # InstructGPT's PPO-ptx, a mean over every process's targets
                ptx_loss = ptx_loss[0] * token_share(ptx[1] >= 0)
                loss = loss + cfg.ptx_coef * k * ptx_loss  # (times k: the slices divide by k)
                part_figures["ptx_loss"] = ptx_loss * k
            finite = finite and not all_agree(not torch.isfinite(loss))
            if finite:
                self.actor_opt.backward(loss / k)
            for name, v in part_figures.items():  # each slice's share of the minibatch's figure
                figures[name] = figures.get(name, 0.0) + v.detach().float() / k
        # the whole minibatch's approx-KL (every slice, every process), before the step
        kl = mean_over_ranks({"kl": figures["approx_kl"].item()})["kl"] if cfg.target_kl > 0 else 0.0
        if kl > cfg.target_kl:  # moved this far already: stop before this minibatch moves it more
            self.actor_opt.discard()
            return figures, False, kl
        stepped = self._finish(self.actor_opt, finite)
        self.critic_step(parts, tokens, figures)
        return figures, stepped, 0.0

    def value_loss_in_actor(self, values, part: Experience, tokens, figures: dict):
        """Nothing for a separate critic (`critic_step`); a shared head's: `shared_value_loss`."""
        return 0.0

    def shared_value_loss(self, values, part: Experience, tokens, figures: dict):
        """A shared value head's clipped value loss x vf_coef, in the actor's loss: one trunk,
        one backward, one optimizer."""
        vf_loss = value_loss(values.float(), part.values, part.returns, part.action_mask,
                             self.cfg.clip_range_value, tokens)
        figures["vf_loss"] = vf_loss
        return self.cfg.vf_coef * vf_loss

    def critic_step(self, parts: list[Experience], tokens, figures: dict) -> None:
        """The separate critic's step on the minibatch's slices: its clipped value loss (with a
        shared head or no critic, `__init__` swaps in `no_critic_step`)."""
        cfg, k, finite = self.cfg, len(parts), True
        for part in parts:
            with self.amp():
                values = self.critic_values(part.sequences, part.attention_mask, part.prompt_len)
            vf_loss = value_loss(values.float(), part.values, part.returns, part.action_mask,
                                 cfg.clip_range_value, tokens)
            finite = finite and not all_agree(not torch.isfinite(vf_loss))
            if finite:
                self.critic_opt.backward(vf_loss / k)
            figures["vf_loss"] = figures.get("vf_loss", 0.0) + vf_loss.detach().float() / k
        self._finish(self.critic_opt, finite)

    @staticmethod
    def no_critic_step(parts, tokens, figures) -> None:
        pass

    def _finish(self, optimizer: Optimizer, finite: bool) -> bool:
        """The step after the backward passes, skipped (and counted) if a loss was not finite."""
        if finite:
            return optimizer.step()
        optimizer.skip()
        return False

    @property
    def skipped_updates(self) -> int:
        """Optimizer steps not taken in the run: non-finite losses, float16 overflows."""
        return self.actor_opt.skipped + (self.critic_opt.skipped if self.critic_opt else 0)

    # ------------------------------------------------------------------ one iteration
    def step(self, prompt_batches, sample_gen=None, shuffle_gen=None,
             refill=None) -> tuple[list[Experience], dict]:
        """One iteration: roll out each batch into the replay buffer (`collect`), learn from it,
        update the KL coefficient. Returns the rollouts and the iteration's figures. `sample_gen`
        draws tokens (model's device), `shuffle_gen` orders minibatches (CPU)."""
        experiences, stats = self.collect(self, prompt_batches, sample_gen, refill)
        self.queue.push(trainable(self.actor))  # --sampler_lag: a later rollout's weights
        stats.update(self.learn(shuffle_gen))
        stats = mean_over_ranks(stats)  # under torchrun: the whole batch's figures
        stats["gen_tokens"] *= world_size()  # a cost: the sum over the processes, not a mean
        self.kl_ctl.update(stats["kl"])
        return experiences, stats

    def rollout(self, batch, generator) -> tuple[Experience, dict]:
        """One rollout batch of (prompt_ids, prompt_mask[, fields]): `make_experience`."""
        ids, mask, *fields = batch
        return self.make_experience(ids, mask, generator, fields=fields[0] if fields else None)

    def play_rollout(self, seeds, generator) -> tuple[Experience, dict]:
        """One rollout batch of episodes, one per seed: `play` without its episodes."""
        return self.play(seeds, generator)[:2]


def collect_all(trainer, prompt_batches, sample_gen, refill=None) -> tuple[list[Experience], dict]:
    """PPO's collection: each batch rolled out once, every row learned from. Returns the
    rollouts and their figures (means, but costs add up)."""
    rolled = [trainer.rollout(batch, sample_gen) for batch in prompt_batches]
    for exp, _ in rolled:
        trainer.buffer.add(trainer.rows_to_learn(exp))
    return [exp for exp, _ in rolled], rollout_figures([stats for _, stats in rolled])
