"""Stage 2 of RLHF: a reward model learns the labeller's preferences.

The SFT trunk plus a scalar head scores a whole response (at its EOS). For each preference
pair, chosen and rejected go through the model in one batch and the loss is
`-log sigmoid(r_chosen - r_rejected)` (InstructGPT eq. 1). One epoch by default, with the
learning rate decaying to 0: preference labels are scarce and a second pass overfits them.

After training, the scores are normalised (mean 0, std 1 on responses sampled from the SFT
policy), so that PPO starts from rewards on a known scale.

    python train_rm.py                         # built-in task, from out/sft
    python train_rm.py --data prefs.jsonl      # {"prompt", "chosen", "rejected"} lines (HH, trl)
    python train_rm.py --lora_rank 16 --grad_accum 4 --grad_checkpoint   # less memory
    torchrun --standalone --nproc_per_node 2 train_rm.py --batch_size 16    # 2 GPUs or CPU processes
    python train_rm.py --ensemble 4 --out_dir out/rm_ensemble   # 4 members and their WARM average
    python train_rm.py --label_noise 0.25 --length_bias 0.3     # a labeller with faults

With `--lora_rank` the trunk trains low-rank adapters and the head is trained in full; the
checkpoint holds the merged weights, so PPO reads it like any other.

Writes out_dir/ckpt.pt (reward model, normalisation, tokenizer, optimizer, step, RNG, which
SFT checkpoint it came from) and out_dir/metrics.jsonl with loss, acc, eval_acc, and on the
built-in task eval_gold_acc and eval_gold_corr. With --ensemble K, each member writes those in
out_dir/member{i}, WARM in out_dir/warm, and out_dir/ensemble.json lists them
(mingpt_rlhf/lab/ensemble.py).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from mingpt_rlhf.machinery.checkpoint import (load_checkpoint, rank_rng_states, restore_rank_rng,
                                              resume_checkpoint, save_checkpoint)
from mingpt_rlhf.stages import (load_policy, load_resume_state, resume_state, reward_model_from,
                                weights_for_later_stages)
from mingpt_rlhf.machinery.cli import (MACHINERY, opt, require_data_for_eval_data, require_non_negative,
                                       require_positive, run)
from mingpt_rlhf.machinery.chat import chat_format_of
from mingpt_rlhf.data import (PairData, encode_example, holdout_split, load_preference_jsonl,
                              micro_batches_of_step, right_pad)
from mingpt_rlhf.machinery.distributed import all_sum, is_main, setup, shutdown, world_size
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.lab.ensemble import warm_average, write_manifest
from mingpt_rlhf.heads import RewardModel, pairwise_loss
from mingpt_rlhf.evaluate import generate_batches
from mingpt_rlhf.machinery.lora import TARGETS_HELP, add_lora, check_lora_options, parse_targets
from mingpt_rlhf.optim import Optimizer, lr_at
from mingpt_rlhf.run.plot import picture_of_run
from mingpt_rlhf.run.metrics import MetricsLog, read_metrics
from mingpt_rlhf.machinery.runtime import (autocast, hold_frozen_in, pick_device, prepare_out_dir,
                                           require_room_for_prompt, resolve_dtype, seed_everything)
from mingpt_rlhf.task_base import check_labeller_faults
from mingpt_rlhf.tasks import gold_agreement, get_task
from mingpt_rlhf.tokenizer import EOS, same_tokenizer


@dataclass
class Config:
    out_dir: str = opt("out/rm", "folder for ckpt.pt and metrics.jsonl")
    sft_dir: str = opt("out/sft", "SFT output folder: the trunk and tokenizer start from it")
    init_from: str = opt("", "start the trunk from published weights instead: a GPT-2 name "
                             "(gpt2, ...), or a folder of GPT-2, Llama 3 / SmolLM2, Qwen2 / 2.5 "
                             "or Qwen3")
    task: str = opt("reviews", "built-in task giving preference pairs and a gold reward")
    data: str = opt("", "JSONL of {prompt, chosen, rejected} lines; replaces the task's pairs")
    eval_data: str = opt("", "held-out preference JSONL (default: 5%% of --data)")
    n_pairs: int = opt(24000, "built-in task: number of training pairs the labeller makes")
    label_noise: float = opt(0.0, "built-in task: flip each pair's label with this probability "
                                  "(0-0.5), on top of the labeller's own errors (eval pairs "
                                  "too; the gold reward stays exact)")
    length_bias: float = opt(0.0, "built-in task: the labeller's taste for length, 0-1: with "
                                  "this probability a pair's label goes to the longer "
                                  "response (more words), whatever the gold; else its own "
                                  "label stands (labeller_faults in mingpt_rlhf/task_base.py)")
    epochs: int = opt(1, "passes over the pairs (more than 1 tends to overfit)")
    batch_size: int = opt(32, "pairs per micro-batch and process (an optimizer step sees "
                              "batch_size x grad_accum x processes under torchrun)")
    grad_accum: int = opt(1, "micro-batches whose gradients add up to one optimizer step")
    lr: float = opt(3e-4, "peak learning rate (AdamW), decayed linearly to 0")
    warmup_iters: int = opt(20, "linear warm-up steps")
    weight_decay: float = opt(0.0, "AdamW weight decay on matrices")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    margin: float = opt(0.0, "margin in -log sigmoid(r_chosen - r_rejected - margin)")
    dropout: float = opt(0.0, "dropout probability while training")
    eval_interval: int = opt(100, "steps between evaluations and checkpoints")
    norm_samples: int = opt(512, "SFT samples used to normalise the scores (0 = no normalising)")
    norm_policy: str = opt("", "the SFT folder of the policy RL will optimise, whose samples set "
                               "the normalisation (default: --sft_dir); for a reward model of "
                               "another size than the policy (same tokenizer)")
    max_new_tokens: int = opt(32, "longest response sampled for normalisation")
    seed: int = opt(1337, "random seed (of the head's start and the order of the pairs)")
    data_seed: int = opt(-1, "seed of the data: the built-in task's pairs, --data's held-out "
                             "split, the policy samples that normalise (-1 = --seed); an "
                             "ensemble's members share it")
    ensemble: int = opt(1, "train this many reward models (>= 2: an ensemble, in "
                           "out_dir/member0 ..: each a whole reward model from the SFT trunk, "
                           "trunk and head trained, seed --seed + i, the same pairs in its own "
                           "order; then out_dir/warm, their weights averaged (WARM); "
                           "train_ppo.py --rm_dir out_dir scores with all of them, "
                           "docs/reward_hacking.md)")
    device: str = opt("auto", "auto | cpu | cuda | mps", group=MACHINERY)
    dtype: str = opt("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, else "
                             "fp32; float16 uses loss scaling)", group=MACHINERY)
    lora_rank: int = opt(0, "LoRA rank for the trunk (0 = train every weight); the head always trains",
                         group=MACHINERY)
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


@torch.no_grad()
def score_texts(model, tokenizer, prompts, responses, device, ctx, batch_size=128, normalise=True):
    """RM scores (N,) of prompt + response + EOS texts."""
    block = model.config.block_size
    scores = []
    for i in range(0, len(prompts), batch_size):
        rows = [encode_example(tokenizer, p, r, block)[0]
                for p, r in zip(prompts[i:i + batch_size], responses[i:i + batch_size])]
        ids, mask = right_pad(rows, tokenizer.pad_id)
        with ctx:
            scores.append(model(ids.to(device), mask.to(device), normalise).float().cpu())
    return torch.cat(scores)


@torch.no_grad()
def evaluate(model, data: PairData, task, eval_pairs, tokenizer, device, ctx, batch_size):
    model.eval()
    losses, correct = [], 0
    for i in range(0, len(data), batch_size):
        idx = list(range(i, min(i + batch_size, len(data))))
        ids, mask, _ = data.batch(idx)
        with ctx:
            scores = model(ids.to(device), mask.to(device)).float()
        chosen, rejected = scores[:len(idx)], scores[len(idx):]
        losses.append(pairwise_loss(chosen, rejected).item() * len(idx))
        correct += (chosen > rejected).sum().item()
    figures = {"eval_loss": sum(losses) / len(data), "eval_acc": correct / len(data)}
    if task is not None:
        # the gold reward never trains the RM; here it tells how well the RM learned the taste
        prompts = [p.prompt for p in eval_pairs] * 2
        responses = [p.chosen for p in eval_pairs] + [p.rejected for p in eval_pairs]
        rm = score_texts(model, tokenizer, prompts, responses, device, ctx)
        gold = torch.tensor([task.gold_reward(p, f"{r} {EOS}") for p, r in zip(prompts, responses)])
        n = len(eval_pairs)
        differ = gold[:n] != gold[n:]
        agree = ((rm[:n] > rm[n:]) == (gold[:n] > gold[n:]))[differ]
        figures["eval_gold_acc"] = agree.float().mean().item()
        figures["eval_gold_corr"] = torch.corrcoef(torch.stack([rm, gold]))[0, 1].item()
    model.train()
    return figures


@torch.no_grad()
def sft_sample_scores(policy, model, tokenizer, prompts, cfg, ctx):
    """Raw RM scores (N,) of responses sampled from the SFT policy, scored as PPO scores them:
    the generated token ids, read at the last real token. The samples are drawn with the data
    seed, so an ensemble's members are normalised on the same ones."""
    model.eval()
    gen = torch.Generator(device=next(policy.parameters()).device).manual_seed(data_seed_of(cfg))
    scores = []
    with ctx:
        for out in generate_batches(policy, tokenizer, prompts, cfg.max_new_tokens,
                                    temperature=1.0, generator=gen):
            scores.append(model(out.sequences, out.attention_mask, normalise=False).float().cpu())
    return torch.cat(scores)


def data_seed_of(cfg: Config) -> int:
    return cfg.seed if cfg.data_seed < 0 else cfg.data_seed


def load_norm_sampler(cfg: Config, policy, tokenizer):
    """The policy whose samples set the normalisation: the one RL will optimise (--norm_policy,
    or the SFT the reward model starts from)."""
    norm_sampler = policy
    if cfg.norm_policy and cfg.norm_samples > 0:
        norm_sampler, other, _ = load_policy(cfg.norm_policy, flag="--norm_policy")
        if not same_tokenizer(tokenizer, other):
            raise UserError(f"--norm_policy {cfg.norm_policy} uses another tokenizer than "
                            f"--sft_dir {cfg.sft_dir}; pass an SFT of the same task")
    require_room_for_prompt(cfg.max_new_tokens, norm_sampler.config.block_size)  # normalisation samples
    return norm_sampler


def preference_data(cfg: Config, tokenizer):
    """(task or None, train pairs, eval pairs): the built-in task's labeller's, or --data's."""
    task = None if cfg.data else get_task(cfg.task, seed=data_seed_of(cfg), n_pairs_train=cfg.n_pairs,
                                          label_noise=cfg.label_noise, length_bias=cfg.length_bias)
    if task is not None:
        task.check_vocabulary(tokenizer, cfg.init_from or cfg.sft_dir)
        return task, task.preference_pairs("train"), task.preference_pairs("eval")
    chat = chat_format_of(tokenizer)  # a messages line is rendered in the policy's format
    train_pairs = load_preference_jsonl(cfg.data, chat)
    if cfg.eval_data:
        return task, train_pairs, load_preference_jsonl(cfg.eval_data, chat)
    return (task, *holdout_split(train_pairs, data_seed_of(cfg)))


def normalise(model, norm_sampler, tokenizer, task, train_pairs, cfg: Config, device, ctx) -> dict:
    """Set the model's gain and bias so that the scores of the policy's own samples get mean 0
    and std 1; returns norm_gain and norm_bias."""
    prompts = task.prompts("train") if task else [p.prompt for p in train_pairs if p.prompt.strip()]
    if prompts:
        raw = sft_sample_scores(norm_sampler.to(device), model, tokenizer,
                                prompts[:cfg.norm_samples], cfg, ctx)
    else:
        print("note: the pairs have no prompts to sample from; normalising on the scores "
              "of their own chosen and rejected texts instead")
        texts = [(p.prompt, side) for p in train_pairs[:cfg.norm_samples] for side in (p.chosen, p.rejected)]
        model.eval()
        raw = score_texts(model, tokenizer, *zip(*texts), device, ctx, normalise=False)
    model.set_normalisation(raw)
    print(f"normalised on {len(raw)} SFT samples: gain {model.gain.item():.4f}, "
          f"bias {model.bias.item():.4f}")
    return {"norm_gain": model.gain.item(), "norm_bias": model.bias.item()}


# options that make an ensemble's member what it is: a member trained (or resumed) under
# --ensemble must have been started with the same ones (its seed is --seed + its index)
MEMBER_FIXED = ("sft_dir", "init_from", "task", "data", "eval_data", "n_pairs", "label_noise",
                "length_bias", "data_seed", "epochs", "batch_size", "grad_accum", "lr",
                "norm_samples", "norm_policy", "lora_rank", "seed")


def finished(out_dir: str) -> bool:
    """Whether the run in out_dir ended: its metrics.jsonl ends with the final summary (written
    after the last checkpoint)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    return os.path.exists(path) and any(r.get("final") for r in read_metrics(path)[-1:])


def train_ensemble(cfg: Config) -> dict:
    """--ensemble K: K members in out_dir/member{i}, each a train_rm.py run of its own (seed
    --seed + i, the data seed shared), then WARM in out_dir/warm, then out_dir/ensemble.json.
    With --resume a finished member is kept, a killed one resumed, a missing one trained."""
    if world_size() > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("--ensemble trains its members one after another in one process; run it "
                        "without torchrun (or train each member under torchrun with its own "
                        "--seed and --out_dir)")
    prepare_out_dir(cfg.out_dir)
    names, finals = [f"member{i}" for i in range(cfg.ensemble)], []
    for i, name in enumerate(names):
        out = os.path.join(cfg.out_dir, name)
        member = replace(cfg, out_dir=out, seed=cfg.seed + i, data_seed=data_seed_of(cfg),
                         ensemble=1, resume=False)
        saved = os.path.join(out, "ckpt.pt")
        if cfg.resume and os.path.exists(saved):
            started = load_checkpoint(saved, "ensemble member", mmap=True).get("config", {})
            for key in MEMBER_FIXED:
                if key in started and started[key] != getattr(member, key):
                    raise UserError(f"{saved} was trained with --{key} {started[key]}, and this "
                                    f"ensemble's member {i} would be {getattr(member, key)}; "
                                    f"resume with the options the ensemble was started with, "
                                    f"or pass another --out_dir")
            if finished(out):
                finals.append(read_metrics(os.path.join(out, "metrics.jsonl"))[-1])
                print(f"{name}: finished, kept")
                continue
            member.resume = True
        print(f"---- {name} of {cfg.ensemble} (seed {member.seed})")
        finals.append(main(member))
    warm = train_warm(cfg, names)
    write_manifest(cfg.out_dir, names, "warm")
    keys = [k for k in ("eval_acc", "eval_gold_acc") if k in finals[0]]
    summary = {f"member{i}_{k}": f[k] for i, f in enumerate(finals) for k in keys}
    summary.update({f"warm_{k}": warm[k] for k in keys if k in warm})
    print(f"ensemble of {cfg.ensemble} in {cfg.out_dir}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in summary.items()))
    return summary


@torch.no_grad()
def train_warm(cfg: Config, names: list[str]) -> dict:
    """WARM: the members' weights averaged (ensemble.warm_average), evaluated and normalised
    on the policy's samples like a member, saved as a reward model in out_dir/warm."""
    out = os.path.join(cfg.out_dir, "warm")
    device = pick_device(cfg.device)
    ctx = autocast(device, resolve_dtype(cfg.dtype, device))
    seed_everything(cfg.seed)
    policy, tokenizer, origin = load_policy(cfg.sft_dir, cfg.init_from)
    paths = [os.path.join(cfg.out_dir, name, "ckpt.pt") for name in names]
    members = [reward_model_from(load_checkpoint(p, "ensemble member", mmap=True), p, tokenizer,
                                 cfg.sft_dir) for p in paths]
    model = warm_average(members).to(device)
    task, train_pairs, eval_pairs = preference_data(cfg, tokenizer)
    eval_data = PairData(tokenizer, eval_pairs, model.config.block_size)
    figures = evaluate(model, eval_data, task, eval_pairs, tokenizer, device, ctx, 2 * cfg.batch_size)
    if cfg.norm_samples > 0:
        figures.update(normalise(model, load_norm_sampler(cfg, policy, tokenizer), tokenizer,
                                 task, train_pairs, cfg, device, ctx))
    prepare_out_dir(out)
    save_checkpoint(os.path.join(out, "ckpt.pt"), {
        "stage": "rm", "model": model.state_dict(), "model_config": asdict(model.config),
        "tokenizer": tokenizer.state_dict(), "step": 0, "config": asdict(cfg),
        "normalised": cfg.norm_samples > 0, "sft": origin, "warm_of": names})
    summary = MetricsLog(out).log(0, final=True, **figures)
    print("warm: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
    return summary


def main(cfg: Config) -> dict:
    # ---- config, device, seed
    require_positive(cfg, "epochs", "batch_size", "grad_accum", "eval_interval", "max_new_tokens",
                     "lr", "n_pairs", "ensemble")
    require_non_negative(cfg, "warmup_iters", "grad_clip", "weight_decay", "norm_samples")
    if not 0 <= cfg.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    check_lora_options(cfg)
    require_data_for_eval_data(cfg)
    check_labeller_faults(cfg.label_noise, cfg.length_bias)
    if cfg.data and (cfg.label_noise or cfg.length_bias):
        raise UserError("--label_noise and --length_bias are faults of the built-in task's "
                        "labeller; with --data your labels are used as they are: drop them")
    if cfg.ensemble > 1:
        return train_ensemble(cfg)
    device = setup(pick_device(cfg.device))  # joins the other processes under torchrun
    world = world_size()
    dtype = resolve_dtype(cfg.dtype, device)
    ctx = autocast(device, dtype)
    seed_everything(cfg.seed)
    prepare_out_dir(cfg.out_dir)
    ckpt_path, resumed = resume_checkpoint(cfg.out_dir, cfg.resume, "rm")
    policy, tokenizer, origin = load_policy(cfg.sft_dir, cfg.init_from)
    norm_sampler = load_norm_sampler(cfg, policy, tokenizer)

    # ---- data
    task, train_pairs, eval_pairs = preference_data(cfg, tokenizer)

    # ---- model: the SFT trunk + a fresh head (what trained comes back from the checkpoint
    # on resume)
    model = RewardModel(policy.config)
    model.gpt.load_state_dict(policy.state_dict())
    if cfg.lora_rank > 0:
        add_lora(model.gpt, cfg.lora_rank, cfg.lora_alpha, parse_targets(cfg.lora_targets))
    model.gpt.set_dropout(cfg.dropout)
    model.gpt.grad_checkpoint = cfg.grad_checkpoint
    if cfg.compile:
        model.gpt.compile_blocks()
    hold_frozen_in(model.to(device), dtype)  # a LoRA base in the autocast dtype
    if resumed:  # into the model as the first run held it when it saved
        load_resume_state(model, resumed["resume"], ckpt_path)
    block = model.config.block_size
    train_data = PairData(tokenizer, train_pairs, block)
    eval_data = PairData(tokenizer, eval_pairs, block)
    if train_data.skipped:
        print(f"skipped {train_data.skipped} pairs that do not fit block_size {block}")
    pairs_per_step = cfg.batch_size * cfg.grad_accum * world  # over all processes
    steps_per_epoch = len(train_data) // pairs_per_step
    if steps_per_epoch == 0:
        raise UserError(f"{len(train_data)} pairs are fewer than --batch_size x --grad_accum "
                        f"x processes ({pairs_per_step})")
    max_iters = steps_per_epoch * cfg.epochs
    print(f"{len(train_data)} train / {len(eval_data)} eval pairs, {max_iters} steps, device {device}")
    if task is not None:
        print(f"label ceiling: the gold reward itself agrees with {gold_agreement(task, eval_pairs):.3f} "
              f"of the held-out labels (the labeller is noisy)")

    # ---- optimizer
    groups = model.gpt.optim_groups(cfg.weight_decay) + [
        {"params": list(model.head.parameters()), "weight_decay": 0.0}]
    optimizer = Optimizer([dict(g, lr=cfg.lr) for g in groups], dtype, device, cfg.grad_clip)
    step = 0
    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
        restore_rank_rng(resumed, ckpt_path)
        step = resumed["step"]
    log = MetricsLog(cfg.out_dir, resume_step=step if resumed else None,
                     time_offset=resumed["time"] if resumed else 0.0)

    def save(step: int, normalised: bool = False, rng=None):
        save_checkpoint(ckpt_path, {
            "stage": "rm", "model": weights_for_later_stages(model),
            "model_config": asdict(model.config), "resume": resume_state(model),
            "tokenizer": tokenizer.state_dict(), "optimizer": optimizer.state_dict(),
            "step": step, "rng": rng or rank_rng_states(), "time": log.elapsed(), "config": asdict(cfg),
            "normalised": normalised,
            "sft": origin})

    def run_eval(step: int) -> dict:
        figures = evaluate(model, eval_data, task, eval_pairs, tokenizer, device, ctx, 2 * cfg.batch_size)
        log.log(step, split="eval", **figures)
        tqdm.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        return figures

    # ---- loop: each epoch visits every pair once, in an order fixed by (seed, epoch)
    model.train()
    bar = tqdm(range(step, max_iters), initial=step, total=max_iters, desc="rm", dynamic_ncols=True,
               disable=not is_main())
    for step in bar:
        scale = lr_at(step, max_iters, 1.0, cfg.warmup_iters, "linear")
        optimizer.set_lr_scale(scale)
        lr = cfg.lr * scale
        loss, correct = 0.0, 0
        # micro-batches (this process's share of each): their gradients add up
        for idx in micro_batches_of_step(len(train_data), step, cfg.seed, cfg.batch_size, cfg.grad_accum):
            ids, mask, _ = train_data.batch(idx)
            with ctx:
                # one forward for chosen and rejected together, then split the scores
                scores = model(ids.to(device), mask.to(device), normalise=False).float()  # (2B,)
            chosen, rejected = scores[:len(idx)], scores[len(idx):]
            micro = pairwise_loss(chosen, rejected, cfg.margin) / cfg.grad_accum
            optimizer.backward(micro)
            loss = loss + micro.detach()
            correct = correct + (chosen > rejected).sum()  # no sync until logged
        optimizer.step()
        if step % 10 == 0:
            loss = all_sum(loss) / world  # over all processes' pairs
            acc = all_sum(correct).item() / pairs_per_step
            log.log(step, loss=loss.item(), acc=acc, lr=lr)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}")
        if (step + 1) % cfg.eval_interval == 0 and step + 1 < max_iters:
            if is_main():
                run_eval(step + 1)
            save(step + 1)
    bar.close()
    final_rng = rank_rng_states()  # every rank's, before rank 0 goes on alone
    if not is_main():  # rank 0 evaluates, normalises and writes the reward model
        shutdown()
        return {}
    final = run_eval(max_iters)

    # ---- normalise: scores of the SFT policy's own samples get mean 0 and std 1
    if cfg.norm_samples > 0:
        final.update(normalise(model, norm_sampler, tokenizer, task, train_pairs, cfg, device, ctx))
    save(max_iters, normalised=cfg.norm_samples > 0, rng=final_rng)
    summary = log.log(max_iters, final=True, **final, skipped_updates=optimizer.skipped)
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    picture_of_run(cfg.out_dir)
    shutdown()
    return summary


if __name__ == "__main__":
    run(main, Config)
