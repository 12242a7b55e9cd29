"""DPO: learn the preferences directly from the pairs, with no reward model and no sampling.

From the SFT checkpoint, on the same preference pairs as train_rm.py (the built-in task's, or
`--data` JSONL), minimise `-log sigmoid(beta * ((logp_c - ref_c) - (logp_r - ref_r)))` with
log-probs summed over response tokens (mingpt_rlhf/methods/dpo.py). The reference is the frozen SFT
policy; with `--lora_rank` it is the policy with its adapters switched off (no second copy).

    python train_dpo.py                          # built-in task, from out/sft
    python train_dpo.py --data prefs.jsonl       # {"prompt", "chosen", "rejected"} lines
    python train_dpo.py --loss ipo --beta 0.5    # IPO's squared loss
    python train_dpo.py --init_from ~/models/Qwen3-0.6B --data prefs.jsonl --lora_rank 16
    torchrun --standalone --nproc_per_node 2 train_dpo.py --batch_size 16   # 2 GPUs or CPU processes

Logs loss, reward_acc (implicit reward of chosen > rejected), margin, chosen_reward and
rejected_reward; the held-out eval samples the policy on held-out prompts as train_ppo.py does
(gold, well_formed on the built-in task; kl to the SFT policy; distinct2; rm_score with
--rm_dir). Writes out_dir/ckpt.pt (a policy, read by sample.py and like any later stage) and
out_dir/metrics.jsonl.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from mingpt_rlhf.stages import (load_policy, load_resume_state, load_reward_model, resume_state,
                                weights_for_later_stages)
from mingpt_rlhf.machinery.checkpoint import (rank_rng_states, restore_rank_rng, resume_checkpoint,
                                              save_checkpoint)
from mingpt_rlhf.machinery.cli import (MACHINERY, opt, require_data_for_eval_data, require_non_negative,
                                       require_positive, run)
from mingpt_rlhf.machinery.chat import chat_format_of
from mingpt_rlhf.data import PairData, holdout_split, load_preference_jsonl, micro_batches_of_step
from mingpt_rlhf.machinery.distributed import is_main, mean_over_ranks, setup, shutdown, world_size
from mingpt_rlhf.methods.dpo import dpo_loss, response_logprob_sums
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.evaluate import distinct_n, generate_batches, response_texts
from mingpt_rlhf.machinery.lora import (TARGETS_HELP, adapters_disabled, add_lora, check_lora_options,
                                        parse_targets)
from mingpt_rlhf.optim import Optimizer, lr_at
from mingpt_rlhf.run.plot import picture_of_run
from mingpt_rlhf.run.metrics import MetricsLog
from mingpt_rlhf.machinery.runtime import (autocast, hold_frozen_in, pick_device, prepare_out_dir,
                                           require_room_for_prompt, resolve_dtype, seed_everything)
from mingpt_rlhf.tasks import get_task


@dataclass
class Config:
    out_dir: str = opt("out/dpo", "folder for ckpt.pt and metrics.jsonl")
    sft_dir: str = opt("out/sft", "SFT output folder: policy and reference start from it")
    init_from: str = opt("", "policy and reference from published weights instead of --sft_dir: "
                             "a GPT-2 name, or a folder of GPT-2, Llama 3 / SmolLM2, Qwen2 / 2.5 "
                             "or Qwen3 (docs/families.md)")
    task: str = opt("reviews", "built-in task giving preference pairs, prompts and a gold reward")
    data: str = opt("", "JSONL of {prompt, chosen, rejected} lines; replaces the task's pairs")
    eval_data: str = opt("", "held-out preference JSONL (default: 5%% of --data)")
    n_pairs: int = opt(24000, "built-in task: number of training pairs the labeller makes")
    loss: str = opt("sigmoid", "sigmoid (DPO) | ipo (squared loss towards h = 1 / (2 beta))")
    beta: float = opt(0.3, "DPO's beta: the strength of the implicit KL to the reference "
                           "(IPO's tau). 0.3, not the paper's 0.1: on the built-in task 0.1 "
                           "ended at gold 0.76 against 0.83 (docs/methods.md)")
    nll_coef: float = opt(0.1, "weight of the chosen responses' LM loss (nats per token) added to "
                               "the DPO loss (RPO, Pang et al. 2024): keeps the chosen likely "
                               "while the pair's margin grows (0 = plain DPO, which broke the "
                               "grammar of up to a fifth of the responses in the tuning runs "
                               "of docs/methods.md)")
    epochs: int = opt(1, "passes over the pairs")
    batch_size: int = opt(32, "pairs per micro-batch and process (a step sees batch_size x "
                              "grad_accum x processes under torchrun)")
    grad_accum: int = opt(1, "micro-batches whose gradients add up to one optimizer step")
    lr: float = opt(1e-3, "peak learning rate (AdamW), decayed linearly to 0")
    warmup_iters: int = opt(20, "linear warm-up steps")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    eval_interval: int = opt(150, "steps between evaluations and checkpoints")
    eval_prompts: int = opt(200, "held-out prompts sampled at each eval")
    max_new_tokens: int = opt(32, "longest sampled response at eval")
    rm_dir: str = opt("", "a reward model folder to score the eval samples with (optional)")
    seed: int = opt(1337, "random seed")
    device: str = opt("auto", "auto | cpu | cuda | mps", group=MACHINERY)
    dtype: str = opt("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, else "
                             "fp32; float16 uses loss scaling)", group=MACHINERY)
    lora_rank: int = opt(0, "LoRA rank (0 = train every weight); the reference is then the "
                            "policy with its adapters off", group=MACHINERY)
    lora_alpha: float = opt(32.0, "LoRA scale alpha (the update is alpha / rank x B A)",
                            group=MACHINERY)
    lora_targets: str = opt("c_attn,c_proj,c_fc", TARGETS_HELP,
                            group=MACHINERY)
    grad_checkpoint: bool = opt(False, "recompute each block in backward: less memory, ~30%% more compute",
                                group=MACHINERY)
    compile: bool = opt(False, "torch.compile the model's blocks for training and scoring passes "
                               "(not sampling): on a 2-core CPU ~50 s to compile and no faster "
                               "(docs/speed.md); meant for GPUs", group=MACHINERY)
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")


def check_config(cfg: Config):
    require_positive(cfg, "epochs", "batch_size", "grad_accum", "eval_interval", "eval_prompts",
                     "max_new_tokens", "lr", "n_pairs")
    require_non_negative(cfg, "warmup_iters", "grad_clip")
    if cfg.loss not in ("sigmoid", "ipo"):
        raise UserError(f"--loss must be sigmoid or ipo, got {cfg.loss!r}")
    if cfg.nll_coef < 0:
        raise UserError(f"--nll_coef must be >= 0, got {cfg.nll_coef}")
    if cfg.beta <= 0:
        raise UserError(f"--beta must be > 0, got {cfg.beta}")
    check_lora_options(cfg)
    require_data_for_eval_data(cfg)


def main(cfg: Config) -> dict:
    # ---- config, device, seed
    check_config(cfg)
    device = setup(pick_device(cfg.device))  # joins the other processes under torchrun
    world = world_size()
    dtype = resolve_dtype(cfg.dtype, device)
    ctx = autocast(device, dtype)
    seed_everything(cfg.seed)
    prepare_out_dir(cfg.out_dir)
    ckpt_path, resumed = resume_checkpoint(cfg.out_dir, cfg.resume, "dpo")

    # ---- models: the policy and its frozen reference, both the SFT model at the start
    policy, tokenizer, origin = load_policy(cfg.sft_dir, cfg.init_from)
    require_room_for_prompt(cfg.max_new_tokens, policy.config.block_size)  # the eval samples
    policy.to(device)
    if cfg.lora_rank > 0:
        add_lora(policy, cfg.lora_rank, cfg.lora_alpha, parse_targets(cfg.lora_targets))
        ref = None  # the policy with its adapters switched off
    else:
        # frozen: from an SFT checkpoint, its weights stay pages of the file
        ref = load_policy(cfg.sft_dir, cfg.init_from, frozen=True)[0].to(device)
    policy.grad_checkpoint = cfg.grad_checkpoint
    if cfg.compile:
        policy.compile_blocks()
    for model in (policy, ref):
        if model is not None:
            hold_frozen_in(model, dtype)
    if resumed:  # into the policy as the first run held it when it saved
        load_resume_state(policy, resumed["resume"], ckpt_path)
    rm = None
    if cfg.rm_dir:
        rm = load_reward_model(cfg.rm_dir, tokenizer, cfg.init_from or cfg.sft_dir).to(device)
    suppress = tokenizer.pad_id if tokenizer.pad_id != tokenizer.eos_id else None

    def reference():  # the frozen SFT policy
        return adapters_disabled(policy) if ref is None else contextlib.nullcontext()

    # ---- data: the preference pairs of train_rm.py, and held-out prompts for the eval
    task = None if cfg.data else get_task(cfg.task, seed=cfg.seed, n_pairs_train=cfg.n_pairs)
    if task is not None:
        task.check_vocabulary(tokenizer, cfg.init_from or cfg.sft_dir)
        train_pairs, eval_pairs = task.preference_pairs("train"), task.preference_pairs("eval")
        eval_prompts = task.prompts("eval")[:cfg.eval_prompts]
    else:
        train_pairs = load_preference_jsonl(cfg.data, chat_format_of(tokenizer))
        if cfg.eval_data:
            eval_pairs = load_preference_jsonl(cfg.eval_data, chat_format_of(tokenizer))
        else:
            train_pairs, eval_pairs = holdout_split(train_pairs, cfg.seed)
        # the eval samples a response to each prompt, and sampling needs a prompt token
        eval_prompts = [p.prompt for p in eval_pairs if p.prompt.strip()][:cfg.eval_prompts]
        if not eval_prompts:
            raise UserError("every held-out pair has an empty prompt, and the eval samples "
                            "responses to their prompts; give the pairs a \"prompt\"")
    block = policy.config.block_size
    train_data = PairData(tokenizer, train_pairs, block)
    if train_data.skipped:
        print(f"skipped {train_data.skipped} pairs that do not fit block_size {block}")
    pairs_per_step = cfg.batch_size * cfg.grad_accum * world  # over all processes
    steps_per_epoch = len(train_data) // pairs_per_step
    if steps_per_epoch == 0:
        raise UserError(f"{len(train_data)} pairs are fewer than --batch_size x --grad_accum "
                        f"x processes ({pairs_per_step})")
    max_iters = steps_per_epoch * cfg.epochs
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    print(f"dpo ({cfg.loss}, beta {cfg.beta}); {len(train_data)} pairs, {max_iters} steps, "
          f"{trained / 1e6:.2f}M trained params, device {device}")

    # ---- optimizer
    optimizer = Optimizer([{"params": [p for p in policy.parameters() if p.requires_grad],
                            "lr": cfg.lr, "weight_decay": 0.0}], dtype, device, cfg.grad_clip)
    step = 0
    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
        restore_rank_rng(resumed, ckpt_path)
        step = resumed["step"]
    log = MetricsLog(cfg.out_dir, resume_step=step if resumed else None,
                     time_offset=resumed["time"] if resumed else 0.0)

    def save(step: int):
        save_checkpoint(ckpt_path, {
            "stage": "dpo", "model": weights_for_later_stages(policy),
            "model_config": asdict(policy.config), "tokenizer": tokenizer.state_dict(),
            "resume": resume_state(policy), "optimizer": optimizer.state_dict(), "step": step,
            "rng": rank_rng_states(), "time": log.elapsed(), "config": asdict(cfg), "sft": origin})

    @torch.no_grad()
    def evaluate(step: int) -> dict:
        """Held-out prompts sampled as train_ppo.py samples them (same seed at every eval)."""
        policy.eval()
        gen = torch.Generator(device=device).manual_seed(cfg.seed + 7)
        texts, kl, scores = [], [], []
        # sampling runs in the context too: a LoRA base held in bf16 needs autocast's casts
        with ctx:
            for out in generate_batches(policy, tokenizer, eval_prompts, cfg.max_new_tokens,
                                        generator=gen):
                args = (out.sequences, out.attention_mask, out.action_mask)
                own = response_logprob_sums(policy, *args, suppress=suppress)
                with reference():
                    base = response_logprob_sums(policy if ref is None else ref, *args, suppress=suppress)
                if rm is not None:
                    scores.append(rm(out.sequences, out.attention_mask).float())
                kl.append((own - base).float())
                texts += response_texts(tokenizer, out)
        figures = {"kl": torch.cat(kl).mean().item(), "distinct2": distinct_n(texts, 2)}
        if rm is not None:
            figures["rm_score"] = torch.cat(scores).mean().item()
        if task is not None:
            pairs = list(zip(eval_prompts, texts))
            figures["gold"] = sum(task.gold_reward(p, t) for p, t in pairs) / len(pairs)
            figures["well_formed"] = sum(task.well_formed(p, t) for p, t in pairs) / len(pairs)
        log.log(step, split="eval", **figures)
        tqdm.write(f"eval {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        for p, t in list(zip(eval_prompts, texts))[:3]:
            tqdm.write(f"  [{p}] {t}")
        policy.train()
        return figures

    # ---- loop: each epoch visits every pair once, in an order fixed by (seed, epoch)
    if step == 0 and is_main():
        evaluate(0)
    policy.train()
    bar = tqdm(range(step, max_iters), initial=step, total=max_iters, desc="dpo", dynamic_ncols=True,
               disable=not is_main())
    for step in bar:
        optimizer.set_lr_scale(lr_at(step, max_iters, 1.0, cfg.warmup_iters, "linear"))
        totals = {}
        # micro-batches (this process's share of each): their gradients add up
        for idx in micro_batches_of_step(len(train_data), step, cfg.seed, cfg.batch_size, cfg.grad_accum):
            ids, mask, response = (t.to(device) for t in train_data.batch(idx))
            n = len(idx)
            with ctx:
                with torch.no_grad(), reference():
                    base = response_logprob_sums(policy if ref is None else ref, ids, mask, response, suppress)
                own = response_logprob_sums(policy, ids, mask, response, suppress)
            loss, stats = dpo_loss(own[:n].float(), own[n:].float(), base[:n].float(),
                                   base[n:].float(), cfg.beta, cfg.loss)
            stats["loss"] = loss.detach()  # the DPO (or IPO) loss alone
            if cfg.nll_coef > 0:
                tokens = response[:n, 1:].sum(-1).clamp(min=1)  # response tokens predicted
                nll = -(own[:n].float() / tokens).mean()
                stats["chosen_nll"] = nll.detach()
                loss = loss + cfg.nll_coef * nll
            optimizer.backward(loss / cfg.grad_accum)
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value / cfg.grad_accum
        optimizer.step()
        if step % 10 == 0:
            figures = mean_over_ranks({k: v.item() for k, v in totals.items()})
            log.log(step, **figures)
            bar.set_postfix(loss=f"{figures['loss']:.3f}", acc=f"{figures['reward_acc']:.2f}")
        if (step + 1) % cfg.eval_interval == 0 and step + 1 < max_iters:
            if is_main():
                evaluate(step + 1)
            save(step + 1)
    bar.close()
    final = evaluate(max_iters) if is_main() else {}
    save(max_iters)
    summary = log.log(max_iters, final=True, **final, skipped_updates=optimizer.skipped)
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    picture_of_run(cfg.out_dir)
    shutdown()
    return summary


if __name__ == "__main__":
    run(main, Config)
