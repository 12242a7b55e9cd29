"""Stage 3 of RLHF: PPO against the frozen reward model, with the ptx (pretraining mix) loss.

    actor  = SFT weights (trained)           reference = SFT weights (frozen)
    critic = RM weights, per-token head       reward    = RM, normalised (frozen)

`main` is the loop: each iteration samples responses, scores them, learns from them
(mingpt_rlhf/ppo_trainer.py), logs, and now and then evaluates and saves. `set_up` builds the
models and whatever variant a run asks for; `finish` writes the summary and the report.

    python train_ppo.py                         # built-in task, from out/sft and out/rm
    python train_ppo.py --help                  # every option, the recipe's first

Writes out_dir/ckpt.pt, metrics.jsonl, rollouts.jsonl, report.html (docs/scripts.md).
"""
from __future__ import annotations

import functools
import dataclasses
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from mingpt_rlhf.stages import (load_policy, load_resume_state, load_reward_model, resume_state,
                                weights_for_later_stages)
from mingpt_rlhf.model import load_state_dict_checked
from mingpt_rlhf.machinery.checkpoint import (rank_rng_states, restore_rank_rng, resume_checkpoint,
                                              save_checkpoint)
from mingpt_rlhf.machinery.cli import MACHINERY, opt, run
from mingpt_rlhf.machinery.chat import PLAIN, chat_format_of
from mingpt_rlhf.data import (SFTData, encode_prompt, fields_of, holdout_split, left_pad,
                              load_prompt_rows, load_sft_jsonl)
from mingpt_rlhf.machinery.distributed import is_main, mean_over_ranks, setup, shard, shutdown, world_size
from mingpt_rlhf.machinery.distributed import rank as process_rank
from mingpt_rlhf.methods.distill import NoScore, load_teacher
from mingpt_rlhf.methods.episodes import EnvironmentReward, EpisodeSeeds, EpisodeSource, load_env
from mingpt_rlhf.lab.ensemble import EnsembleReward, RewardEnsemble, load_reward
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.evaluate import decode_rows, distinct_n
from mingpt_rlhf.lab.hacking import HeldOutGap
from mingpt_rlhf.heads import Critic, ScalarHead
from mingpt_rlhf.machinery.lora import TARGETS_HELP, add_lora, has_lora, merged_state_dict, parse_targets
from mingpt_rlhf.losses import ADVANTAGES, GROUP_ALGOS, POLICY_LOSSES, LossSpec, spec_of
from mingpt_rlhf.model import GPTConfig, build_empty
from mingpt_rlhf.run.rl_options import check_config, check_online_dpo, default_of, reads  # noqa: F401 (tests call them here)
from mingpt_rlhf.run.plot import picture_of_run
from mingpt_rlhf.run.report import comparison_lines, report_of_run, update_counts, update_lines
from mingpt_rlhf.run.rollouts import RolloutRecorder
from mingpt_rlhf.ppo import AdaptiveKLController, FixedKLController
from mingpt_rlhf.ppo_trainer import PPOTrainer, trainable
from mingpt_rlhf.rewards import ModelReward, TextReward, load_function, task_reward
from mingpt_rlhf.run.metrics import MetricsLog, read_metrics
from mingpt_rlhf.machinery.runtime import (autocast_of, check_tf32_output_layer, hold_frozen_in,
                                           output_layer_in_tf32, pick_device, prepare_out_dir,
                                           require_room_for_prompt, resolve_dtype, seed_everything)
from mingpt_rlhf.optim import lr_at
from mingpt_rlhf.tasks import get_task
from mingpt_rlhf.run.watch import RunWatch, largest_logratio

# --help's groups: the recipe's options first (RECIPE: every option below without a group), then
# each variant's options under its name (which runs read which: READ_ONLY_WITH, run/rl_options.py)
EXAMPLES = """
More runs:

    python train_ppo.py --critic shared         # value head on the actor's trunk (cheaper)
    python train_ppo.py --prompts prompts.jsonl --ptx_data demos.jsonl
    python train_ppo.py --lora_rank 16          # LoRA: the reference is the actor, adapters off
    python train_ppo.py --rm_dir out/rm_ensemble --ensemble_combine wco   # an ensemble's minimum
    torchrun --standalone --nproc_per_node 2 train_ppo.py   # 2 GPUs or CPU processes share each batch
    python train_ppo.py --algo grpo --reward task          # no reward model: the task's own check
    python train_ppo.py --task sort --sft_dir out/sort/sft --algo grpo --reward task
    python train_ppo.py --reward my_reward.py:score       # your function(prompts, responses)
    python train_ppo.py --env guess --algo grpo --max_new_tokens 3 --sft_dir out/guess/sft \\
        --out_dir out/guess/grpo    # episodes with an environment (docs/multiturn.md)
"""

RECIPE = "PPO, the recipe: data, sizes, sampling, learning rates, KL, GAE, clip, critic, eval"
CRITIC_FREE = "GRPO, RLOO and REINFORCE++: no critic (--algo grpo | rloo | reinforce++)"
ONLINE_DPO = "online DPO (--algo online_dpo)"
KL_AND_REDUCTION = ("the loss, role by role (mingpt_rlhf/losses.py): advantages, policy loss, where "
                    "the KL goes, its estimator, the reduction over tokens")
REFINEMENTS = ("refinements: GSPO's ratio, DAPO's clip-higher, overlong shaping, dynamic "
               "sampling, which tokens learn")
OFF_POLICY = "a sampler behind the learner: its lag and the off-policy corrections"
EPISODES = "multi-turn: episodes with an environment (--env)"
DISTILL = "on-policy distillation (--algo distill): a teacher grades every token the student samples"
ENSEMBLES = "reward-model ensembles (train_rm.py --ensemble K)"
HACKING = "reward hacking: a held-out reward model and the warning signals"


@dataclass
class Config:
    out_dir: str = opt("out/ppo", "folder for ckpt.pt and metrics.jsonl", group=RECIPE)
    sft_dir: str = opt("out/sft", "SFT output folder: actor and reference start from it")
    init_from: str = opt("", "actor and reference from published weights instead of "
                             "--sft_dir: a GPT-2 name (gpt2, ...), or a folder of GPT-2, "
                             "Llama 3 / SmolLM2, Qwen2 / 2.5 or Qwen3")
    rm_dir: str = opt("out/rm", "reward model output folder (with --reward rm): the reward, and "
                                "where the separate critic starts")
    reward: str = opt("rm", "where the reward comes from: rm (the reward model in --rm_dir) | "
                            "task (the built-in task's own check: reviews' gold reward, sort's "
                            "exact match; no reward model) | FILE.py:FUNCTION or "
                            "MODULE:FUNCTION (your function(prompts, responses, **fields) -> "
                            "list of floats, on decoded text, one call per rollout batch; fields: "
                            "the other columns of --prompts)")
    task: str = opt("reviews", "built-in task giving prompts and a gold reward")
    prompts: str = opt("", "JSONL of {prompt, ...} lines; replaces the task's prompts (5%% held "
                           "out for eval unless --eval_prompts_file); every other field of a "
                           "line (e.g. answer) reaches a --reward function as a keyword argument")
    eval_prompts_file: str = opt("", "held-out JSONL of {prompt, ...} lines for eval (with "
                                     "--prompts; the same fields)")
    ptx_data: str = opt("", "JSONL demonstrations for the ptx loss (default: the task's SFT data)")
    algo: str = opt("ppo", "ppo (critic + GAE) | grpo (group-normalised rewards, no critic) | "
                           "rloo (leave-one-out baseline, no critic) | reinforce++ (PPO's "
                           "per-token KL rewards, no critic, returns normalised over the "
                           "whole batch) | online_dpo (DPO's loss on the best and worst of "
                           "each group the policy samples, no critic; mingpt_rlhf/methods/online_dpo.py) | "
                           "distill (on-policy distillation: the reward is -(log pi - log "
                           "pi_teacher) per token, --teacher_dir; mingpt_rlhf/methods/distill.py); "
                           "see docs/methods.md and mingpt_rlhf/lab/refinements.py")
    critic: str = opt("auto", "ppo: separate (own trunk: from the RM, or from the policy "
                              "without one) | shared (a value head on the actor, from zero) | "
                              "auto (separate with --reward rm; shared without an RM: a second "
                              "trunk copied from the policy knows nothing the actor's does not, "
                              "and costs a model)")
    max_iters: int = opt(200, "PPO iterations (rollouts + update)")
    rollout_batch_size: int = opt(64, "responses per rollout batch, all processes together "
                                      "(grpo / rloo: rollout_batch_size / group_size prompts, "
                                      "group_size each)")
    rollouts_per_update: int = opt(1, "rollout batches collected before each update")
    ppo_epochs: int = opt(4, "passes over the replay buffer per update")
    minibatch_size: int = opt(16, "responses per minibatch, all processes together (advantages "
                                  "are whitened once per rollout batch, not per minibatch)")
    max_new_tokens: int = opt(32, "longest response; longer ones get --missing_eos_penalty "
                                  "(unless --penalize_missing_eos false)")
    temperature: float = opt(1.0, "sampling temperature; log-probs use the same one")
    top_k: int = opt(0, "sample from the k best tokens only (0 = off). Off by default: PPO's "
                        "log-probs are of the full distribution, so filtering biases the KL "
                        "(docs/details.md, detail 17)")
    top_p: float = opt(1.0, "nucleus sampling (1 = off); like --top_k, biases the KL if used")
    actor_lr: float = opt(-1.0, "actor learning rate, decayed linearly to 0 (-1 = auto: 1e-4 with "
                                "--reward task or --env, 5e-5 otherwise, a reward model or your "
                                "function included: 1e-4 once collapsed on the reward model, and "
                                "with --reward task 5e-5 was still rising at the end, docs/rewards.md)")
    critic_lr: float = opt(3e-4, "critic (or shared value head) learning rate, decayed linearly")
    kl_coef: float = opt(-1.0, "initial KL penalty coefficient beta (0 = no KL penalty; -1 = "
                               "auto: 0.2 for grpo and rloo with --env, whose runs at 0.05 could "
                               "settle on moves blind to what decides the game "
                               "(docs/multiturn.md), else 0.05); not online_dpo, whose KL is "
                               "--dpo_beta")
    adaptive_kl: bool = opt(True, "adapt beta so that the KL to the SFT policy approaches "
                                  "--kl_target (false: beta stays --kl_coef); not online_dpo")
    kl_target: float = opt(3.0, "target KL to the SFT policy in nats per response: the sum over "
                                "the response's tokens of log pi(a) - log pi_sft(a), averaged "
                                "over the rollout batch (the logged kl), which the adaptive beta "
                                "steers towards. Not --target_kl, the early stop on approx-KL "
                                "between the policy before and during an update")
    kl_horizon: float = opt(10.0, "adaptive KL speed (--adaptive_kl true), in iterations: each iteration, log beta "
                                  "moves by log(KL / target) / horizon, clipped so that beta rises "
                                  "at most x e^(1/horizon) (x1.105 at 10) and falls at most "
                                  "x e^(-0.2/horizon) (x0.980 at 10)")
    gamma: float = opt(1.0, "discount per token: of ppo's GAE and of reinforce++'s returns "
                            "(1 = none)")
    lam: float = opt(0.95, "GAE lambda")
    clip_range: float = opt(0.2, "policy ratio clip epsilon")
    clip_range_value: float = opt(0.2, "value clip range around the old values: past it the "
                                       "value loss stops pushing a value further towards its "
                                       "return (it does not bound how far a value moves)")
    vf_coef: float = opt(0.1, "value loss weight (shared critic only)")
    entropy_coef: float = opt(0.0, "entropy bonus weight")
    ptx_coef: float = opt(-1.0, "weight of the LM loss on demonstrations (0 = off; -1 = auto: "
                                 "0.02 for ppo, 0 for grpo and rloo and with --env). Kept small: the built-in "
                                 "demonstrations are 1/3 negative reviews, so a larger weight "
                                 "pulls the policy back to them")
    target_kl: float = opt(0.02, "stop an update at the first minibatch whose approx-KL to the "
                                 "policy as the update started passes this (0 = off); guards "
                                 "against the sudden KL spikes in docs/results.md. Not "
                                 "--kl_target: this is per token, between the policy the update "
                                 "started from and the one learning (k3), not per response to "
                                 "the SFT policy; a lagging sampler's own gap does not count")
    reward_clip: float = opt(5.0, "clip the reward model's (normalised) scores to +-this (0 = "
                                  "off); rewards from code (--reward task or a function) are "
                                  "used as returned")
    missing_eos_penalty: float = opt(-1.0, "score of a response that ends without EOS (cut off "
                                           "at --max_new_tokens), instead of its own")
    penalize_missing_eos: bool = opt(True, "replace a cut-off response's score by "
                                           "--missing_eos_penalty (false: keep the reward "
                                           "model's or the function's score, for a task "
                                           "without EOS, such as continuing a text for "
                                           "--max_new_tokens tokens)")
    grad_clip: float = opt(1.0, "clip gradient norms to this (0 = off)")
    eval_interval: int = opt(20, "iterations between evaluations and checkpoints")
    eval_prompts: int = opt(200, "held-out prompts sampled at each eval (with --env: held-out "
                                 "episodes, seeds 0, 1, ...)")
    record_rollouts: int = opt(8, "at each eval, record the first this-many held-out prompts' "
                                  "responses (grpo / rloo: a group each; --env: episodes) with "
                                  "every token's log-prob, reference log-prob, value, advantage, "
                                  "reward and entropy into rollouts.jsonl, which report.html shows "
                                  "(0 = off; mingpt_rlhf/run/rollouts.py)")
    seed: int = opt(1337, "random seed")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    group_size: int = opt(0, "grpo / rloo / online_dpo: responses sampled per prompt (a group, "
                             ">= 2; 0 = auto: 2 for online_dpo, else 8)", group=CRITIC_FREE)
    grpo_norm: str = opt("dr", "dr (Dr. GRPO): r - mean(r), token losses summed and divided by "
                               "--max_new_tokens | grpo (the paper): divide by the group's reward "
                               "std and average each response's tokens; needs the KL in the loss "
                               "(with it in the reward, a group of equal scores would get its KL "
                               "noise scaled to +-1 advantages)", group=CRITIC_FREE)
    dpo_beta: float = opt(0.3, "online_dpo: DPO's beta, the strength of the implicit KL to the "
                               "reference (it takes no KL penalty: --kl_in, --kl_estimator, "
                               "--kl_coef, --adaptive_kl and --kl_horizon are refused with it)",
                          group=ONLINE_DPO)
    dpo_loss: str = opt("sigmoid", "online_dpo: sigmoid (DPO) | ipo (squared loss towards "
                                   "h = 1 / (2 beta))", group=ONLINE_DPO)
    kl_in: str = opt("auto", "where the KL penalty goes: reward (beta x --kl_estimator per "
                             "token off the reward; grpo / rloo sum it per response) | loss "
                             "(beta x --kl_estimator per token in the loss, reduced like the "
                             "surrogate, as the GRPO paper; measured weaker here, see "
                             "docs/results.md) | auto (loss with --grpo_norm grpo, and for "
                             "ppo / grpo / rloo with --env; else reward). "
                             "Not online_dpo, whose KL is --dpo_beta", group=KL_AND_REDUCTION)
    kl_estimator: str = opt("auto", "the per-token estimate of KL(policy || reference): k1 "
                                    "(log p - log ref) | k2 ((log p - log ref)^2 / 2) | k3 "
                                    "(e^(ref - log p) - (ref - log p) - 1) | auto (k1 in the "
                                    "reward, k3 in the loss). Only k1 in the reward follows "
                                    "the gradient of the response's KL; in the loss k1 has no "
                                    "KL gradient, k2 misses the later tokens' share, k3 "
                                    "follows each token's KL(reference || policy) "
                                    "(docs/gradients.md)", group=KL_AND_REDUCTION)
    reduction: str = opt("auto", "how token losses become one number: token (mean over the "
                                 "minibatch's tokens) | sequence (mean per response, then over "
                                 "responses) | budget (sum per response / --max_new_tokens) | "
                                 "auto = ppo: token, reinforce++: token, rloo: budget, grpo: "
                                 "budget (--grpo_norm dr, the default) or sequence (--grpo_norm "
                                 "grpo); with --ratio sequence always sequence, GSPO's own, the "
                                 "only one it takes", group=KL_AND_REDUCTION)
    advantages: str = opt("auto", "the entry of losses.ADVANTAGES, where the baseline comes from: "
                                  "auto (the method's: gae for ppo, dr_grpo or grpo for grpo by "
                                  "--grpo_norm, rloo, reinforce++, preference for online_dpo) | "
                                  + " | ".join(ADVANTAGES) + ". A group's baseline (grpo, "
                                  "dr_grpo, rloo) needs --algo grpo or rloo, gae --algo ppo (its "
                                  "critic); reinforce++ and an entry of your own run with --algo "
                                  "ppo or reinforce++ (docs/fork_it.md)", group=KL_AND_REDUCTION)
    policy_loss: str = opt("auto", "the entry of losses.POLICY_LOSSES, the surrogate: auto "
                                   "(token; sequence with --ratio sequence or --offpolicy gspo; "
                                   "clip_cov or kl_cov with --cov_loss; dpo for online_dpo) | "
                                   + " | ".join(POLICY_LOSSES) + ". token: PPO's clipped ratio "
                                   "per token; sequence: GSPO's; cispo: the clipped ratio as a "
                                   "constant weight, no token loses its gradient (MiniMax-M1); an "
                                   "entry of your own is read like token (docs/fork_it.md)",
                           group=KL_AND_REDUCTION)
    ratio: str = opt("token", "token (each token's own ratio, clipped per token) | sequence "
                              "(GSPO: one ratio per response, the geometric mean of its "
                              "tokens', clipped per response; grpo and rloo only, with a small "
                              "--clip_range such as 3e-4; its loss is a mean over responses, "
                              "its own --reduction sequence). Not with --offpolicy tis, "
                              "decoupled or mask, which weigh each token (docs/offpolicy.md): "
                              "--offpolicy gspo or clip take its ratio against the sampler",
                     group=REFINEMENTS)
    clip_range_high: float = opt(0.0, "upper clip of the ratio, 1 + this (DAPO's clip-higher, "
                                      "e.g. 0.28); 0 = --clip_range, the symmetric clip",
                                 group=REFINEMENTS)
    overlong_buffer: int = opt(0, "DAPO's overlong shaping: within this many tokens of "
                                  "--max_new_tokens a response's reward falls linearly, to -1 "
                                  "at the budget (0 = off)", group=REFINEMENTS)
    dynamic_sampling: int = opt(0, "DAPO's dynamic sampling (grpo / rloo): drop the groups whose "
                                   "scores are all equal (they carry no signal) and refill the "
                                   "batch from up to this many more rollout batches of new "
                                   "prompts; if still short, the update uses what it kept (0 = off)",
                                group=REFINEMENTS)
    learn_tokens: str = opt("all", "which response tokens learn (the others' advantages are 0): all "
                                   "| top_entropy (only the --top_entropy_quantile of each "
                                   "rollout's tokens with the highest entropy, Wang et al. 2025) "
                                   "| negative (only the responses whose score is below their "
                                   "baseline, KL aside, learn: what to "
                                   "avoid, Zhu et al. 2025) | any entry of losses.LEARN_TOKENS "
                                   "(docs/fork_it.md)",
                            group=REFINEMENTS)
    top_entropy_quantile: float = opt(0.2, "--learn_tokens top_entropy: the share of a rollout's "
                                           "tokens that learn, those of highest entropy",
                                      group=REFINEMENTS)
    cov_loss: str = opt("none", "the entropy mechanism's policy losses (Cui et al. 2025): none | "
                                "clip_cov (a random --cov_ratio of the tokens whose covariance of "
                                "log-prob and advantage lies in [--clip_cov_low, "
                                "--clip_cov_high] learn nothing from the surrogate) | kl_cov (the "
                                "--cov_ratio of highest covariance pay --kl_cov_coef x |log "
                                "ratio|, and no token is clipped); mingpt_rlhf/lab/entropy.py",
                        group=REFINEMENTS)
    cov_ratio: float = opt(0.02, "--cov_loss: the share of a minibatch's tokens chosen (at "
                                 "least one)", group=REFINEMENTS)
    clip_cov_low: float = opt(1.0, "--cov_loss clip_cov: the covariance band's lower end",
                              group=REFINEMENTS)
    clip_cov_high: float = opt(5.0, "--cov_loss clip_cov: the covariance band's upper end",
                               group=REFINEMENTS)
    kl_cov_coef: float = opt(0.1, "--cov_loss kl_cov: the weight of |log ratio| on the chosen "
                                  "tokens", group=REFINEMENTS)
    sampler_lag: int = opt(0, "0 .. 8: sample each rollout with the weights of this many "
                              "updates ago, as an asynchronous trainer's sampler runs behind its "
                              "learner (it keeps this many copies of the trainable weights; with "
                              "LoRA the adapters); the rollouts are then off-policy (what "
                              "--offpolicy corrects); the logs show the gap as mismatch_kl",
                           group=OFF_POLICY)
    offpolicy: str = opt("auto", "what corrects a sampler whose log-probs differ from the "
                                 "learner's (--sampler_lag, or --dtype bfloat16 / float16): "
                                 "none (the ratio against the learner's own pass) | clip (the "
                                 "ratio and clip against the sampler) | decoupled (clip against "
                                 "the learner, each token weighed by learner / sampler) | tis "
                                 "(that weight capped at --tis_cap) | mask (tokens whose weight "
                                 "leaves [1/C, C] dropped) | gspo (GSPO's sequence ratio against "
                                 "the sampler; grpo and rloo); auto = tis with --tis_cap, else "
                                 "none (mingpt_rlhf/lab/offpolicy.py)", group=OFF_POLICY)
    tis_cap: float = opt(0.0, "the cap C of the importance weight learner / sampler "
                              "probability of each token: tis weighs each token's loss by "
                              "min(weight, C), decoupled caps at C (0: no cap), mask keeps the "
                              "tokens whose weight is in [1/C, C] (tis and mask: 0 = 2); set "
                              "alone, it turns --offpolicy auto into tis. Refused with none, "
                              "clip and gspo, which weigh no token", group=OFF_POLICY)
    env: str = opt("", "play episodes with an environment instead of answering prompts: a "
                       "built-in (guess) | FILE.py:CLASS | MODULE:CLASS, a class with "
                       "reset(seed) -> str and step(action) -> (reply, reward, done); the "
                       "environment gives the rewards (docs/multiturn.md)", group=EPISODES)
    max_turns: int = opt(8, "with --env: most policy turns per episode (each of up to "
                            "--max_new_tokens tokens, ended by EOS)", group=EPISODES)
    mask_env: bool = opt(True, "with --env: keep the environment's tokens out of every loss, "
                               "KL and token mean (false only to see what the mask is for)",
                         group=EPISODES)
    teacher_dir: str = opt("", "distill: the teacher policy's folder (a PPO, GRPO, SFT or DPO run of "
                               "the student's tokenizer; not a reward model), loaded as a model of "
                               "its own in the reference's place", group=DISTILL)
    distill_form: str = opt("sequence", "distill: sequence (each response's summed reward with "
                                        "RLOO's group baseline: the gradient of the reverse KL of "
                                        "whole responses) | token (each token's own reward, no "
                                        "baseline: the per-prefix reverse KL, as Thinking "
                                        "Machines' write-up)", group=DISTILL)
    ensemble_combine: str = opt("mean", "with an ensemble in --rm_dir (train_rm.py --ensemble "
                                        "K): how the members' normalised scores make one "
                                        "reward: mean | wco (their minimum) | uwo (their mean "
                                        "- --uwo_lambda x their variance) | warm (one model, "
                                        "the members' weights averaged); a single reward "
                                        "model takes mean (itself). docs/reward_hacking.md",
                                group=ENSEMBLES)
    uwo_lambda: float = opt(0.5, "--ensemble_combine uwo: the weight of the members' variance "
                                 "(over K, in normalised units squared)", group=ENSEMBLES)
    heldout_rm_dir: str = opt("", "a held-out reward model that never trains the policy, e.g. "
                                  "one trained on other pairs (train_rm.py --data_seed 1 "
                                  "--out_dir out/rm_heldout): each rollout is scored by it "
                                  "too, and the gap (reward - held-out) is logged as "
                                  "heldout_gap, a reward-hacking signal (one more RM forward "
                                  "pass per rollout)", group=HACKING)
    warning_window: int = opt(5, "iterations per window of the reward-hacking signals and "
                                 "hacking_warning logged each iteration (mingpt_rlhf/lab/hacking.py; "
                                 "the first signals after 3 windows)", group=HACKING)
    device: str = opt("auto", "auto | cpu | cuda | mps", group=MACHINERY)
    dtype: str = opt("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, else "
                             "fp32; float16 uses loss scaling)", group=MACHINERY)
    lora_rank: int = opt(0, "LoRA rank for actor and critic (0 = full fine-tuning); with LoRA the "
                            "reference is the actor with its adapters off", group=MACHINERY)
    lora_alpha: float = opt(32.0, "LoRA scale alpha (the update is alpha / rank x B A)",
                            group=MACHINERY)
    lora_targets: str = opt("c_attn,c_proj,c_fc", TARGETS_HELP,
                            group=MACHINERY)
    grad_checkpoint: bool = opt(False, "recompute each block in backward: less memory, ~30%% more compute",
                                group=MACHINERY)
    compile: bool = opt(False, "torch.compile the model's blocks for training and scoring passes "
                               "(not sampling, see --decode_graphs): on a 2-core CPU ~50 s to "
                               "compile and no faster (docs/speed.md); meant for GPUs",
                        group=MACHINERY)
    decode_graphs: bool = opt(False, "on CUDA, sample with a decoding step of fixed shapes, "
                                     "captured as a CUDA graph once per batch size and length and "
                                     "replayed for each token (mingpt_rlhf/machinery/"
                                     "decode_graphs.py; sampling.py's tokens, to rounding); off by "
                                     "default until its GPU tests have run on a GPU (they are "
                                     "written; docs/speed.md). Not used on a CPU or MPS; "
                                     "independent of --compile", group=MACHINERY)
    tf32_output_layer: bool = opt(False, "CUDA only: the float32 output layer's products "
                                         "(forward and backward) on TF32 tensor cores, ~0.003 "
                                         "nats of error in a log-prob (bench/tf32_logprobs.py); "
                                         "every other product as it was", group=MACHINERY)
    generate_batch_size: int = opt(0, "prompts sampled at once per process (0 = its whole share "
                                      "of the rollout batch); "
                                      "fewer hold a smaller KV cache, the largest tensor of the rollout",
                                   group=MACHINERY)
    score_batch_size: int = opt(0, "rows per forward pass when scoring a rollout (actor, "
                                   "reference, critic, RM; no gradients), per process (0 = "
                                   "--minibatch_size, the whole minibatch's, not its share)",
                                group=MACHINERY)
    learn_batch_size: int = opt(0, "rows per forward and backward pass of the update, per process: "
                                   "each minibatch is learnt in slices of this many, their "
                                   "gradients summed before its one step (the same update, less "
                                   "memory for activations; must divide the minibatch's share; "
                                   "0 = the whole minibatch at once). Not with online_dpo: its "
                                   "loss is a mean over the pairs that carry a preference, a "
                                   "count a slice does not know", group=MACHINERY)


# What a resumed run may change: where it runs and in how much memory, how far it goes, how
# often it looks and what watches it, and where its folders and files are (moved, they must
# hold the same: a LoRA run checks its base's fingerprint). Every other option decides what the
# run computes (its models, its data, its objective: the KL, the losses, the advantages, which
# tokens learn), so `--resume` refuses a value other than the checkpoint's
# (`require_same_options`). The learning rates may change when given on the command line (the
# run line says so); else they stay.
RESUME_FREE = ("out_dir", "resume", "max_iters", "eval_interval", "eval_prompts",
               "record_rollouts", "warning_window", "heldout_rm_dir", "device", "dtype",
               "compile", "decode_graphs", "tf32_output_layer", "grad_checkpoint",
               "generate_batch_size", "score_batch_size",
               "learn_batch_size", "sft_dir", "rm_dir", "init_from", "prompts",
               "eval_prompts_file", "ptx_data")
RESUME_LR = ("actor_lr", "critic_lr")


def load_models(cfg: Config, device, dtype):
    """(tokenizer, actor, ref, rm, critic, value_head); rm is None unless --reward rm."""
    policy, tokenizer, origin = load_policy(cfg.sft_dir, cfg.init_from)
    rm = rm_ckpt = None
    if cfg.reward == "rm":
        # one reward model, or an ensemble's members (rm_ckpt: the first's) or its WARM model
        rm, rm_ckpt, rm_path = load_reward(cfg.rm_dir, tokenizer, cfg.init_from or cfg.sft_dir,
                                           cfg.ensemble_combine, cfg.uwo_lambda)
        if not rm_ckpt.get("normalised"):
            print("note: the reward model was not normalised (train_rm.py --norm_samples 0)")
    if not cfg.prompts and not cfg.env:  # the built-in task's prompts, in the policy's tokens
        get_task(cfg.task).check_vocabulary(tokenizer, cfg.init_from or cfg.sft_dir)

    # dropout is off in every model (load_policy and below), so the first ratio is 1 (to rounding)
    actor = policy.to(device)
    if cfg.lora_rank > 0:
        add_lora(actor, cfg.lora_rank, cfg.lora_alpha, parse_targets(cfg.lora_targets))
        ref = None  # the actor with its adapters switched off: no second copy of the model
    else:  # read again, frozen: pages of the SFT checkpoint rather than a copy of the actor
        ref = load_policy(cfg.sft_dir, cfg.init_from, frozen=True)[0].to(device)
    if cfg.algo == "distill":  # the teacher in the reference's place (methods/distill.py)
        ref = load_teacher(cfg, tokenizer, device)
    if rm is not None:
        rm = rm.to(device)
    critic = value_head = None
    if cfg.algo != "ppo":
        pass  # critic-free: the group is the baseline
    elif cfg.critic == "separate":
        if rm is not None:
            critic = build_empty(lambda: Critic(GPTConfig(**rm_ckpt["model_config"])))
            critic.load_trunk_and_head(rm_ckpt["model"], rm_path)  # in normalised reward units
        else:  # no RM: the policy's trunk (its adapters are 0 yet), a head from zero
            critic = Critic(actor.config)
            critic.gpt.load_state_dict(merged_state_dict(actor) if has_lora(actor)
                                       else actor.state_dict())
        critic.gpt.set_dropout(0.0)
        if cfg.lora_rank > 0:
            add_lora(critic.gpt, cfg.lora_rank, cfg.lora_alpha, parse_targets(cfg.lora_targets))
        critic.to(device)
        critic.gpt.grad_checkpoint = cfg.grad_checkpoint
    else:
        # the actor's trunk is not the RM's, so the RM's head means nothing on it: start at 0
        value_head = ScalarHead(actor.config.n_embd).to(device)
        torch.nn.init.zeros_(value_head.weight)
        torch.nn.init.zeros_(value_head.bias)
    actor.grad_checkpoint = cfg.grad_checkpoint
    if cfg.compile:
        actor.compile_blocks()
        if critic is not None:
            critic.gpt.compile_blocks()
    if cfg.tf32_output_layer:  # where log-probs are taken: the policy and its reference
        for model in (actor, ref):
            if model is not None:
                output_layer_in_tf32(model)
    # frozen weights (reference, reward model, LoRA bases) in the autocast dtype: less memory,
    # the same numbers (runtime.hold_frozen_in)
    for model in (actor, ref, rm, critic):
        if model is not None:  # only the actor's merged weights are saved: no float32 copy else
            hold_frozen_in(model, dtype, keep_float32_base=model is actor)
    return tokenizer, actor, ref, rm, critic, value_head


def prompt_splits(cfg: Config, task, chat=PLAIN) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out eval rows), each row {"prompt": str, ...}: the task's splits,
    or --prompts with --eval_prompts_file, or --prompts with 5 % of it held out (an eval on
    prompts the policy trains on would flatter it). A file's other fields ride along; its
    messages lines are rendered in `chat`, the policy's chat format."""
    if task is not None:
        train, held_out = ([{"prompt": p} for p in task.prompts(split)] for split in ("train", "eval"))
    elif cfg.eval_prompts_file:
        train, held_out = load_prompt_rows(cfg.prompts, chat), load_prompt_rows(cfg.eval_prompts_file, chat)
        if set(train[0]) != set(held_out[0]):
            raise UserError(f"{cfg.eval_prompts_file} has fields {sorted(held_out[0])}, "
                            f"{cfg.prompts} {sorted(train[0])}; give both files the same fields")
    else:
        train, held_out = holdout_split(load_prompt_rows(cfg.prompts, chat), cfg.seed)
    return train, held_out[:cfg.eval_prompts]


def require_same_options(cfg: Config, saved: dict, path: str, given_lr=()) -> list[str]:
    """A resumed run computes what the first run computed: refuse any option outside
    RESUME_FREE whose (resolved) value differs from the checkpoint's, naming the value the run
    was started with. An option the run does not read computes nothing (a GRPO run's
    --critic, which checkpoints saved resolved); an option the checkpoint does not hold (an
    older one's) is not compared. A learning rate in `given_lr` (given on the command line)
    may change; one not given takes the checkpoint's value. Returns "--actor_lr 1e-4 (5e-5
    before the resume)" for each that changed."""
    changed = []
    for field in dataclasses.fields(cfg):
        name, value = field.name, getattr(cfg, field.name)
        if name in RESUME_FREE or name not in saved or saved[name] == value or not reads(cfg, name):
            continue
        if name in RESUME_LR:
            if name in given_lr:
                changed.append(f"--{name} {value:g} ({saved[name]:g} before the resume)")
            else:
                setattr(cfg, name, saved[name])
            continue
        shown = lambda v: str(v).lower() if isinstance(v, bool) else f"{v}"
        raise UserError(f"{path} was started with --{name} {shown(saved[name])}, not "
                        f"{shown(value)}; resume with --{name} {shown(saved[name])} (or without "
                        f"the option), or start anew in another --out_dir")
    return changed


def response_and_prompt_texts(tokenizer, exp) -> tuple[list[str], list[str]]:
    """Decoded responses (EOS included) and the prompts they answered, from an Experience."""
    T = exp.prompt_len
    return (decode_rows(tokenizer, exp.sequences[:, T:], exp.action_mask),
            decode_rows(tokenizer, exp.sequences[:, :T], exp.attention_mask[:, :T]))


def share_of_process(cfg: Config, world: int) -> Config:
    """The sizes one process works with under torchrun: its share of every rollout batch and
    of every minibatch (whole GRPO / RLOO groups). One process: `cfg` itself."""
    grouped = cfg.algo in GROUP_ALGOS
    groups = cfg.rollout_batch_size // (cfg.group_size if grouped else 1)
    if groups % world or cfg.minibatch_size % world:
        unit = "groups" if grouped else "prompts"
        raise UserError(f"with {world} processes, the {groups} {unit} of --rollout_batch_size "
                        f"and --minibatch_size {cfg.minibatch_size} must both divide by {world}")
    if world == 1:
        return cfg
    # scoring has no gradients, so its batch need not shrink with the minibatch's share:
    # under 8 processes and a minibatch of 16 a share is 2 rows, too few to fill a GPU
    return replace(cfg, rollout_batch_size=cfg.rollout_batch_size // world,
                   minibatch_size=cfg.minibatch_size // world,
                   score_batch_size=cfg.score_batch_size or cfg.minibatch_size)


def reward_of(cfg: Config, rm, task, tokenizer, rows: int, device, dtype):
    """Where the RL reward comes from (rewards.py): the reward model's normalised score at
    the last real token (an ensemble's combined, with --heldout_rm_dir also a held-out model's
    gap), the task's own check, a user's function, or the environment's steps."""
    amp = autocast_of(device, dtype)  # the run's mixed precision, each call
    if cfg.reward == "env":
        return EnvironmentReward()  # each step of the environment gives its reward
    if cfg.reward == "task":
        return task_reward(task, tokenizer)
    if cfg.reward == "teacher":  # distillation: the teacher's log-probs are the whole reward
        return NoScore()
    if cfg.reward != "rm":
        return TextReward(*load_function(cfg.reward), tokenizer)
    # an ensemble's reward also keeps its members' disagreement (ens_std)
    reward_fn = (EnsembleReward if isinstance(rm, RewardEnsemble) else ModelReward)(rm, rows, amp)
    if cfg.heldout_rm_dir:  # scores every rollout too, to log the gap (lab/hacking.py)
        heldout = load_reward_model(cfg.heldout_rm_dir, tokenizer, cfg.init_from or cfg.sft_dir)
        hold_frozen_in(heldout.to(device), dtype)
        reward_fn = HeldOutGap(reward_fn, heldout, rows, amp)
    return reward_fn


class TrainingPrompts:
    """The prompts of each rollout batch and the held-out evaluation. `draw()` gives this
    process's share of one rollout batch, (ids, mask, fields): rollout_batch_size prompts drawn
    at random, or for grpo / rloo rollout_batch_size / group_size prompts each repeated
    group_size times in a row (a group); every rank draws the same ones and keeps its slice
    (whole groups). `fields`: the prompts file's other columns, for the reward function.
    (With --env, episodes.EpisodeSeeds plays this part.)"""

    def __init__(self, cfg: Config, local: Config, tokenizer, task, train_rows, eval_rows,
                 device, generator):
        self.cfg, self.local, self.tokenizer, self.task, self.device = cfg, local, tokenizer, task, device
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.max_prompt = None  # set by `encode`, once the policy's block size is known
        self.generator = generator  # which prompts: the same on every rank
        self.group = cfg.group_size if cfg.algo in GROUP_ALGOS else 1

    def encode(self, block_size: int) -> None:
        require_room_for_prompt(self.cfg.max_new_tokens, block_size)
        self.max_prompt = block_size - self.cfg.max_new_tokens
        self.encoded = [encode_prompt(self.tokenizer, r["prompt"], self.max_prompt)
                        for r in self.train_rows]

    def describe(self) -> str:
        return f"{len(self.train_rows)} train / {len(self.eval_rows)} eval prompts"

    def draw(self):
        idx = torch.randint(len(self.encoded), (self.cfg.rollout_batch_size // self.group,),
                            generator=self.generator)
        indices = shard(idx.repeat_interleave(self.group).tolist(), self.local.rollout_batch_size)
        ids, mask = left_pad([self.encoded[i] for i in indices], self.tokenizer.pad_id)
        return ids.to(self.device), mask.to(self.device), fields_of([self.train_rows[i] for i in indices])

    def figures(self, experiences) -> dict:
        """The training batch's gold (a built-in task), the mean over every process."""
        if self.task is None:
            return {}
        golds = [self.task.gold_reward(p, r) for e in experiences
                 for r, p in zip(*response_and_prompt_texts(self.tokenizer, e))]
        return mean_over_ranks({"gold": sum(golds) / len(golds)})

    @torch.no_grad()
    def evaluate(self, step: int, trainer, recorder, log, reward_fn, score_name: str) -> dict:
        """Held-out prompts, sampled as in training, scored by the reward, KL and (if any) gold."""
        cfg, tokenizer, task = self.cfg, self.tokenizer, self.task
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed + 7)  # same samples each eval
        reward_fn.begin(f"the eval at iteration {step}")
        eval_prompts = [r["prompt"] for r in self.eval_rows]
        rows = [encode_prompt(tokenizer, p, self.max_prompt) for p in eval_prompts]
        figures, responses, prompts = {score_name: 0.0, "kl": 0.0}, [], []
        # rank 0 evaluates alone, in batches of one process's share (and, inside
        # make_experience, of --generate_batch_size): the memory a training rollout needs
        batch = self.local.rollout_batch_size
        for i in range(0, len(rows), batch):
            ids, mask = left_pad(rows[i:i + batch], tokenizer.pad_id)
            fields = fields_of(self.eval_rows[i:i + batch])
            exp, stats = trainer.make_experience(ids.to(self.device), mask.to(self.device), gen,
                                                 for_update=False, fields=fields)
            recorder.record(trainer, step, exp, first=i, fields=fields)
            n = len(exp.scores)
            figures[score_name] += stats["rm_score"] * n
            figures["kl"] += stats["kl"] * n
            responses += response_and_prompt_texts(tokenizer, exp)[0]
            prompts += eval_prompts[i:i + n]
        figures = {k: v / len(rows) for k, v in figures.items()}
        figures["distinct2"] = distinct_n(responses, 2)
        if task is not None:
            figures["gold"] = sum(task.gold_reward(p, r) for p, r in zip(prompts, responses)) / len(rows)
            figures["well_formed"] = sum(task.well_formed(p, r) for p, r in zip(prompts, responses)) / len(rows)
            figures.update(task.extra_eval_figures(prompts, responses))  # sort: gold_unseen
        log.log(step, split="eval", **figures)
        tqdm.write(f"eval {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        for p, r in list(zip(prompts, responses))[:3]:
            tqdm.write(f"  [{p}] {r}")
        return figures


def main(cfg: Config) -> dict:
    """One RL run: the set-up, then max_iters iterations of roll out, score, learn, log, with
    an eval and a checkpoint every eval_interval, then the final eval and the summary."""
    run = set_up(cfg)  # config, models, data, the reward, the trainer; a resumed run's state
    trainer, source, reward_fn, watch = run.trainer, run.source, run.reward_fn, run.watch
    if run.step == 0 and is_main():
        run.initial = run.evaluate(0)
    watch.first_step = run.step  # this process's first iteration, resumed or not
    bar = tqdm(range(run.step, cfg.max_iters), initial=run.step, total=cfg.max_iters,
               desc=cfg.algo, dynamic_ncols=True, disable=not is_main())
    for step in bar:
        trainer.set_lr_scale(lr_at(step, cfg.max_iters, 1.0, 0, "linear"))  # linear decay to 0
        batches = [source.draw() for _ in range(cfg.rollouts_per_update)]
        reward_fn.begin(f"iteration {step + 1}")  # errors of a reward from code name where
        experiences, stats = trainer.step(batches, run.sample_gen, run.shuffle_gen,
                                          refill=source.draw)
        stats[run.score_name] = stats.pop("rm_score")
        stats.update(source.figures(experiences))  # the gold of a built-in task
        stats.update(mean_over_ranks(reward_fn.figures()))  # an ensemble's ens_std, heldout_gap
        stats["max_logratio"] = largest_logratio(trainer, trainer.first_minibatch)
        stats.update(watch.check(stats, step + 1, trainer.kl_ctl))  # warnings, hacking
        run.log.log(step + 1, **stats)
        bar.set_postfix(**{"rm" if cfg.reward == "rm" else "reward": f"{stats[run.score_name]:.2f}",
                           **({"gold": f"{stats['gold']:.2f}"} if "gold" in stats else {}),
                           "kl": f"{stats['kl']:.2f}"})
        if (step + 1) % cfg.eval_interval == 0 and step + 1 < cfg.max_iters:
            if is_main():
                run.evaluate(step + 1)
            run.save(step + 1)
    bar.close()
    return finish(run)


@dataclass
class Run:
    """What main's loop works with, built by `set_up`: the trainer (its models, optimizers
    and KL controller), where batches come from, the reward, the watcher, the logs, the random
    streams, and what a checkpoint saves beside them."""
    cfg: Config
    trainer: PPOTrainer
    source: object               # TrainingPrompts, or episodes.EpisodeSeeds with --env
    reward_fn: object            # rewards.py (ModelReward, ...), lab/ensemble.py, methods/episodes.py
    watch: RunWatch
    log: MetricsLog
    recorder: RolloutRecorder
    tokenizer: object
    score_name: str              # what the logs call the reward: rm_score, or reward
    sample_gen: torch.Generator  # draws tokens (on the model's device)
    shuffle_gen: torch.Generator  # orders minibatches, picks ptx batches (CPU)
    prompt_gen: torch.Generator  # which prompts (the same on every rank)
    ckpt_path: str
    step: int = 0                # the first iteration: 0, or where a resumed run saved
    initial: dict | None = None  # the SFT policy's eval figures (step 0)

    def evaluate(self, step: int) -> dict:
        return self.source.evaluate(step, self.trainer, self.recorder, self.log, self.reward_fn,
                                    self.score_name)

    def save(self, step: int) -> None:
        trainer, actor = self.trainer, self.trainer.actor
        critic, value_head = trainer.critic, trainer.value_head
        save_checkpoint(self.ckpt_path, {
            "stage": self.cfg.algo, "model": weights_for_later_stages(actor),
            "model_config": asdict(actor.config), "tokenizer": self.tokenizer.state_dict(),
            "actor": resume_state(actor),
            "critic": resume_state(critic) if critic is not None else None,
            "value_head": value_head.state_dict() if value_head is not None else None,
            "actor_opt": trainer.actor_opt.state_dict(),
            "critic_opt": trainer.critic_opt.state_dict() if trainer.critic_opt else None,
            "kl_ctl": trainer.kl_ctl.state_dict(), "kl_over_target": self.watch.kl_high,
            "step": step,
            "rng": rank_rng_states(sample=self.sample_gen, shuffle=self.shuffle_gen),
            "prompt_rng": self.prompt_gen.get_state(),
            "sampler_behind": trainer.queue.state(),  # --sampler_lag: the sampler's weights
            "time": self.log.elapsed(), "config": asdict(self.cfg), "initial_eval": self.initial})


def set_up(cfg: Config) -> Run:
    """Everything before the first iteration: the options checked, the device, the seed, the
    models, the data, the reward, the trainer and, with --resume, every state the run saved."""
    # ---- config, device, seed
    given_lr = [name for name in RESUME_LR if getattr(cfg, name) != default_of(cfg, name)]
    check_config(cfg)
    device = setup(pick_device(cfg.device))  # joins the other processes under torchrun
    world, rank = world_size(), process_rank()
    dtype = resolve_dtype(cfg.dtype, device)
    check_tf32_output_layer(cfg.tf32_output_layer, device)
    if (cfg.tis_cap or cfg.offpolicy not in ("auto", "none")) and dtype == torch.float32 \
            and not cfg.sampler_lag:
        raise UserError("--tis_cap and --offpolicy correct a sampler whose log-probs differ from "
                        "the learner's; in float32 the sampler's are the learner's (they are "
                        "reused): pass --dtype bfloat16 or float16, or --sampler_lag 1, or drop "
                        "--tis_cap / --offpolicy")
    if cfg.dynamic_sampling and world > 1:
        raise UserError("--dynamic_sampling keeps a different number of rows on each process; "
                        "run it in one process (without torchrun)")
    seed_everything(cfg.seed)
    prepare_out_dir(cfg.out_dir)
    ckpt_path, resumed = resume_checkpoint(cfg.out_dir, cfg.resume, cfg.algo)
    lr_changes = []
    if resumed:
        lr_changes = require_same_options(cfg, resumed.get("config", {}), ckpt_path, given_lr)
    local = share_of_process(cfg, world)  # (after the resume: it may take the saved rates)
    if local.learn_batch_size and local.minibatch_size % local.learn_batch_size:
        raise UserError(f"--learn_batch_size {local.learn_batch_size} must divide each process's "
                        f"minibatch of {local.minibatch_size} rows (--minibatch_size / processes)")

    # ---- models
    tokenizer, actor, ref, rm, critic, value_head = load_models(cfg, device, dtype)

    # ---- data: prompts to roll out on (or episodes' seeds), demonstrations for ptx
    task = None if cfg.prompts or cfg.env else get_task(cfg.task, seed=cfg.seed)
    prompt_gen = torch.Generator().manual_seed(cfg.seed)  # which prompts: the same on every rank
    if cfg.env:
        env_class, env_name = load_env(cfg.env)
        source = EpisodeSeeds(cfg, local, env_class, env_name, device, prompt_gen)
    else:
        env_class = None
        source = TrainingPrompts(cfg, local, tokenizer, task, *prompt_splits(cfg, task, chat_format_of(tokenizer)), device,
                                 prompt_gen)
    ptx_data = None
    if cfg.ptx_coef > 0:
        demos = load_sft_jsonl(cfg.ptx_data) if cfg.ptx_data else (task.sft_examples("train") if task else None)
        if cfg.env and not cfg.ptx_data:
            demos = None
        if demos is None:
            raise UserError("--ptx_coef > 0 needs demonstrations: pass --ptx_data demos.jsonl, "
                            "or --ptx_coef 0")
        ptx_data = SFTData(tokenizer, demos, actor.config.block_size)
    source.encode(actor.config.block_size)

    # ---- the reward, the KL controller, the trainer (its optimizers)
    reward_fn = reward_of(cfg, rm, task, tokenizer, local.score_batch_size or local.minibatch_size,
                          device, dtype)
    score_name = "rm_score" if cfg.reward == "rm" else "reward"  # what the logs call it
    kl_ctl = (FixedKLController(0.0) if cfg.algo == "online_dpo"  # its KL: DPO's beta, in the loss
              else FixedKLController(1.0) if cfg.algo == "distill"  # -(log pi - log teacher)
              else AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl
              else FixedKLController(cfg.kl_coef))
    trainer = PPOTrainer(local, actor, ref, reward_fn, critic=critic, value_head=value_head,
                         eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, kl_ctl=kl_ctl,
                         ptx_data=ptx_data, amp=autocast_of(device, dtype), dtype=dtype,
                         episodes=EpisodeSource(env_class, env_name, tokenizer, cfg.max_turns,
                                                cfg.mask_env) if cfg.env else None)
    # sampling needs a generator on the model's device; randperm / randint (minibatch order,
    # ptx batches) build CPU tensors and refuse a CUDA one, so they get a CPU generator.
    # Under torchrun each rank has its own streams (rank 0's are a single process's).
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed + 1 + 1000 * rank)
    shuffle_gen = torch.Generator().manual_seed(cfg.seed + 2 + 1000 * rank)
    # the run's warnings and reward-hacking signals (run/watch.py); best: the most an
    # episode can return, if its environment says
    watch = RunWatch(cfg, getattr(env_class, "best_return", None))
    step = 0
    if resumed:
        restore(resumed, ckpt_path, trainer, critic, value_head, watch, prompt_gen,
                sample_gen, shuffle_gen)
        step = resumed["step"]
    initial = resumed.get("initial_eval") if resumed else None  # the SFT policy's figures
    log = MetricsLog(cfg.out_dir, resume_step=step if resumed else None,
                     time_offset=resumed["time"] if resumed else 0.0)
    watch.resume([r for r in read_metrics(log.path) if "split" not in r and not r.get("final")]
                 if resumed and is_main() else [])
    # the same held-out prompts at every eval, token by token, for report.html (run/rollouts.py)
    recorder = RolloutRecorder(cfg.out_dir, min(cfg.record_rollouts, cfg.eval_prompts), tokenizer,
                               cfg.seed, task, env_class, resume_step=step if resumed else None)
    print(run_line(cfg, actor, source, device, dtype, trainer.kl_ctl.value, lr_changes))
    return Run(cfg, trainer, source, reward_fn, watch, log, recorder, tokenizer, score_name,
               sample_gen, shuffle_gen, prompt_gen, ckpt_path, step, initial)


def finish(run: Run) -> dict:
    """After the last iteration: the final eval and checkpoint, the summary line of the logs
    (with the updates that stopped early or took no step), what changed since the SFT policy,
    the curves and report.html."""
    cfg, trainer = run.cfg, run.trainer
    final = run.evaluate(cfg.max_iters) if is_main() else {}
    run.save(cfg.max_iters)
    updates = update_counts(read_metrics(run.log.path)) if is_main() else {}
    summary = run.log.log(cfg.max_iters, final=True, **final,
                          skipped_updates=trainer.skipped_updates,
                          **{k: v for k, v in updates.items() if k not in ("iterations", "stuck")},
                          stuck_iterations=sum(k for _, k in updates.get("stuck", [])))
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    if run.initial:
        print("\n".join(comparison_lines(run.initial, final, cfg.algo,
                                         "episodes" if cfg.env else "prompts")))
    if updates:
        print("\n".join(update_lines(updates)))
    picture_of_run(cfg.out_dir)
    report_of_run(cfg.out_dir)  # report.html: curves and recorded tokens, opens in a browser
    shutdown()
    return summary


def restore(resumed: dict, ckpt_path: str, trainer, critic, value_head, watch, prompt_gen,
            sample_gen, shuffle_gen) -> None:
    """Every state a killed run saved, put back: weights, optimizers, the KL controller, the
    warnings' counts, the lagging sampler's weights and every random stream."""
    load_resume_state(trainer.actor, resumed["actor"], ckpt_path)
    if critic is not None:
        load_resume_state(critic, resumed["critic"], ckpt_path)
    elif value_head is not None:
        load_state_dict_checked(value_head, resumed["value_head"], ckpt_path)
    trainer.actor_opt.load_state_dict(resumed["actor_opt"])
    if trainer.critic_opt is not None:
        trainer.critic_opt.load_state_dict(resumed["critic_opt"])
    trainer.kl_ctl.load_state_dict(resumed["kl_ctl"])
    watch.kl_high = resumed["kl_over_target"]
    prompt_gen.set_state(resumed["prompt_rng"])
    if not trainer.queue.load(resumed.get("sampler_behind"), [p.shape for p in trainable(trainer.actor)]):
        raise UserError(f"{ckpt_path} holds a lagging sampler's weights of another model or "
                        f"lag; resume with the options it was trained with")
    restore_rank_rng(resumed, ckpt_path, sample=sample_gen, shuffle=shuffle_gen)


def run_line(cfg: Config, actor, source, device, dtype, beta: float, lr_changes=()) -> str:
    """The line that says what this run trains, with what, on what; `beta`: the KL
    controller's (a resumed run's is where it was saved); `lr_changes`: learning rates a
    resumed run was given anew."""
    trained = sum(p.numel() for p in actor.parameters() if p.requires_grad)
    method = (f"ppo, critic {cfg.critic}" if cfg.algo == "ppo" else "reinforce++, no critic"
              if cfg.algo == "reinforce++" else
              f"{cfg.algo}, groups of {cfg.group_size}")
    method += (f", DPO's {cfg.dpo_loss} loss, beta {cfg.dpo_beta}, best vs worst of each group"
               if cfg.algo == "online_dpo" else
               f", the reward -(log pi - log pi_teacher) per token, the teacher {cfg.teacher_dir} "
               f"({cfg.distill_form} form)" if cfg.algo == "distill" else
               f", KL {cfg.kl_estimator} in the {cfg.kl_in}, beta {beta:.4g}"
               f"{' (adaptive)' if cfg.adaptive_kl else ''}")
    # each role of losses.py whose entry is not PPO's (the KL's were said above)
    spec, ppo = spec_of(cfg), LossSpec()
    roles = [f"{role} {getattr(spec, role)}" for role in ("advantages", "policy_loss", "reduction",
                                                          "learn_tokens")
             if getattr(spec, role) != getattr(ppo, role)]
    method += f"; loss: {', '.join(roles)}" if roles else ""
    method += "".join(f"; {change}" for change in lr_changes)
    return (f"{method}; actor {actor.num_params() / 1e6:.2f}M params ({trained / 1e6:.2f}M "
            f"trained), {source.describe()}, device {device}, {str(dtype).replace('torch.', '')}")


if __name__ == "__main__":
    run(main, Config)
