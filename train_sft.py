"""Stage 1 of RLHF: supervised fine-tuning (SFT) on demonstrations.

Next-token cross-entropy on prompt + response + EOS, counted on the response tokens only by
default (the prompt is context; `--loss_on_prompt` counts it too). The result is the policy
that the reward model starts from and that PPO fine-tunes, and the frozen reference of PPO.

    python train_sft.py                        # built-in "reviews" task, tiny GPT, ~1 min on CPU
    python train_sft.py --data demos.jsonl     # your {"prompt", "response"} or {"text"} lines
    python train_sft.py --env guess --out_dir out/guess/sft   # the guessing game's teacher episodes
    python train_sft.py --data episodes.jsonl  # your {"turns": [{"role", "text"}, ...]} episodes
    python train_sft.py --init_from gpt2 --data demos.jsonl   # start from GPT-2 weights
    python train_sft.py --init_from gpt2 --data demos.jsonl --lora_rank 16 --grad_accum 4
    torchrun --standalone --nproc_per_node 2 train_sft.py --batch_size 32   # 2 GPUs or CPU processes

At a 50k vocabulary the loss applies the output layer to the target positions only, in
float32 chunks (mingpt_rlhf/logprobs.py). `--grad_accum` adds up the gradients of several
micro-batches per optimizer step, `--grad_checkpoint` recomputes activations in backward, and
`--lora_rank` trains low-rank adapters instead of every weight (mingpt_rlhf/machinery/lora.py).

Writes out_dir/ckpt.pt (model, tokenizer, optimizer, step, RNG) and out_dir/metrics.jsonl.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from mingpt_rlhf.stages import load_resume_state, resume_state, weights_for_later_stages
from mingpt_rlhf.machinery.checkpoint import (rank_rng_states, restore_rank_rng, resume_checkpoint,
                                              save_checkpoint)
from mingpt_rlhf.machinery.distributed import (all_sum, is_main, setup, shard, shutdown, token_share,
                                               world_size)
from mingpt_rlhf.machinery.cli import (MACHINERY, opt, require_data_for_eval_data, require_non_negative,
                                       require_positive, run)
from mingpt_rlhf.machinery.chat import Conversation
from mingpt_rlhf.data import IGNORE, SFTData, Transcript, holdout_split, load_sft_jsonl
from mingpt_rlhf.methods.episodes import EpisodeSource, load_env, play_and_measure
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.evaluate import policy_report, sample_responses
from mingpt_rlhf.logprobs import lm_loss
from mingpt_rlhf.machinery.lora import TARGETS_HELP, add_lora, check_lora_options, parse_targets
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.optim import Optimizer, lr_at
from mingpt_rlhf.run.plot import picture_of_run
from mingpt_rlhf.run.metrics import MetricsLog
from mingpt_rlhf.machinery.runtime import (autocast, check_tf32_output_layer, hold_frozen_in,
                                           output_layer_in_tf32, pick_device, prepare_out_dir,
                                           require_room_for_prompt, resolve_dtype, seed_everything)
from mingpt_rlhf.tasks import get_task
from mingpt_rlhf.tokenizer import WordTokenizer, tokenizer_from_state


@dataclass
class Config:
    out_dir: str = opt("out/sft", "folder for ckpt.pt and metrics.jsonl")
    task: str = opt("reviews", "built-in task giving demonstrations and a gold reward")
    data: str = opt("", "JSONL of {prompt, response}, {text}, {turns: [{role, text}, ...]} (an "
                        "episode) or {messages: [{role, content}, ...]} (a conversation in the "
                        "model's chat format) lines: loss on the policy's / assistant's turns "
                        "only; replaces the task's data")
    env: str = opt("", "an environment (built-in: guess; or FILE.py:CLASS): the eval plays its "
                       "held-out episodes (success, turns); without --data a built-in one's "
                       "teacher episodes are the demonstrations (docs/multiturn.md)")
    max_turns: int = opt(8, "with --env: most policy turns of an eval episode")
    eval_data: str = opt("", "held-out JSONL for eval_loss (default: 5%% of --data)")
    init_from: str = opt("", "start from published weights: a GPT-2 name (gpt2, ...), or a "
                             "folder of GPT-2, Llama 3 / SmolLM2, Qwen2 / 2.5 or Qwen3 "
                             "(docs/families.md)")
    n_layer: int = opt(4, "transformer blocks (new model only)")
    n_head: int = opt(4, "attention heads (new model only)")
    n_embd: int = opt(128, "embedding width (new model only)")
    block_size: int = opt(64, "longest prompt + response in tokens (new model only)")
    dropout: float = opt(0.0, "dropout probability while training")
    batch_size: int = opt(64, "sequences per micro-batch and process (an optimizer step sees "
                              "batch_size x grad_accum x processes under torchrun)")
    grad_accum: int = opt(1, "micro-batches whose gradients add up to one optimizer step")
    max_iters: int = opt(800, "optimizer steps")
    lr: float = opt(1e-3, "peak learning rate (AdamW)")
    warmup_iters: int = opt(50, "linear warm-up steps, then cosine decay to lr/10")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    loss_on_prompt: bool = opt(False, "also train on prompt tokens (default: response only)")
    eval_interval: int = opt(200, "steps between evaluations and checkpoints")
    eval_prompts: int = opt(200, "held-out prompts sampled at each eval (built-in task)")
    max_new_tokens: int = opt(32, "longest sampled response (with --env: turn) at eval")
    temperature: float = opt(1.0, "sampling temperature of the eval samples")
    seed: int = opt(1337, "random seed")
    device: str = opt("auto", "auto | cpu | cuda | mps", group=MACHINERY)
    dtype: str = opt("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, else "
                             "fp32; float16 uses loss scaling)", group=MACHINERY)
    lora_rank: int = opt(0, "LoRA rank (0 = train every weight); checkpoints hold merged weights",
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
    tf32_output_layer: bool = opt(False, "CUDA only: the float32 output layer's products "
                                         "(forward and backward) on TF32 tensor cores, ~0.003 "
                                         "nats of error in a log-prob (bench/tf32_logprobs.py); "
                                         "every other product as it was", group=MACHINERY)
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")


def check_config(cfg: Config):
    require_positive(cfg, "n_layer", "n_head", "n_embd", "block_size", "batch_size",
                     "grad_accum", "max_iters", "eval_interval", "max_new_tokens", "lr")
    require_non_negative(cfg, "eval_prompts", "warmup_iters", "grad_clip", "weight_decay")
    require_positive(cfg, "max_turns")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"--n_embd {cfg.n_embd} must be divisible by --n_head {cfg.n_head}")
    if not 0 <= cfg.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {cfg.temperature}")
    check_lora_options(cfg)
    require_data_for_eval_data(cfg)


def load_demonstrations(cfg: Config, task, env_class=None):
    """(train, eval) demonstrations: (prompt, response) pairs, or Transcripts of episodes."""
    if not cfg.data and env_class is not None:
        teacher = getattr(env_class, "teacher_episodes", None)
        if teacher is None:
            raise UserError(f"--env {cfg.env} has no teacher of its own: pass its episodes as "
                            f"--data episodes.jsonl ({{\"turns\": [...]}} lines)")
        return teacher("train", cfg.seed), teacher("eval", cfg.seed)
    if not cfg.data:
        return task.sft_examples("train"), task.sft_examples("eval")
    train = load_sft_jsonl(cfg.data)
    if cfg.eval_data:
        return train, load_sft_jsonl(cfg.eval_data)
    return holdout_split(train, cfg.seed)


def make_tokenizer(cfg: Config, task, train_pairs, env_class=None):
    if cfg.init_from:
        from mingpt_rlhf.machinery.bpe import BPETokenizer
        return BPETokenizer.from_pretrained(cfg.init_from)
    if task is not None:
        return task.tokenizer()
    if not cfg.data and env_class is not None:  # a built-in environment's words
        return env_class.tokenizer()
    return WordTokenizer.from_texts(" ".join(text for _, text in item)
                                    if isinstance(item, (Transcript, Conversation))
                                    else item[0] + " " + item[1] for item in train_pairs)


@torch.no_grad()
def eval_loss(model, data: SFTData, batch_size, device, ctx) -> float:
    """Mean next-token loss (nats per target token) over every example of `data`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(data), batch_size):
        inputs, targets = data.batch(range(i, min(i + batch_size, len(data))))
        with ctx:
            total += lm_loss(model, inputs.to(device), targets.to(device), reduction="sum").item()
        count += (targets != IGNORE).sum().item()
    model.train()
    return total / max(1, count)


def main(cfg: Config) -> dict:
    # ---- config, device, seed
    check_config(cfg)
    device = setup(pick_device(cfg.device))  # joins the other processes under torchrun
    world = world_size()
    dtype = resolve_dtype(cfg.dtype, device)
    check_tf32_output_layer(cfg.tf32_output_layer, device)
    ctx = autocast(device, dtype)
    seed_everything(cfg.seed)
    prepare_out_dir(cfg.out_dir)
    ckpt_path, resumed = resume_checkpoint(cfg.out_dir, cfg.resume, "sft")

    # ---- data
    env_class, env_name = load_env(cfg.env) if cfg.env else (None, "")
    task = None if cfg.data or cfg.env else get_task(cfg.task, seed=cfg.seed)
    train_pairs, eval_pairs = load_demonstrations(cfg, task, env_class)
    if resumed:
        tokenizer = tokenizer_from_state(resumed["tokenizer"])
        if task is not None:  # resumed with another --task: its text would be <unk>
            task.check_vocabulary(tokenizer, cfg.out_dir, fix="resume with the --task it "
                                  "started with, or pass another --out_dir to start anew")
    else:
        tokenizer = make_tokenizer(cfg, task, train_pairs, env_class)

    # ---- model: built as the first run built it (so resuming with other model options
    # fails naming the tensor that does not fit, and a LoRA run finds its base again)
    if cfg.init_from:
        model = GPT.from_pretrained(cfg.init_from, vocab_size=tokenizer.vocab_size)
    else:
        model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=cfg.block_size,
                              n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd))
    if cfg.lora_rank > 0:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, parse_targets(cfg.lora_targets))
    model.set_dropout(cfg.dropout)
    model.grad_checkpoint = cfg.grad_checkpoint
    if cfg.compile:
        model.compile_blocks()
    hold_frozen_in(model.to(device), dtype)  # a LoRA base in the autocast dtype
    if cfg.tf32_output_layer:
        output_layer_in_tf32(model)
    if resumed:  # into the model as the first run held it when it saved
        load_resume_state(model, resumed["resume"], ckpt_path)
    block_size = model.config.block_size
    require_room_for_prompt(cfg.max_new_tokens, block_size)  # the eval samples
    train_data = SFTData(tokenizer, train_pairs, block_size, cfg.loss_on_prompt)
    eval_data = SFTData(tokenizer, eval_pairs, block_size, cfg.loss_on_prompt)
    if train_data.skipped:
        print(f"skipped {train_data.skipped} demonstrations whose response does not fit "
              f"block_size {block_size}")
    eval_prompts = [p for p, _ in eval_pairs][:cfg.eval_prompts] if task else []
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{model.num_params() / 1e6:.2f}M parameters ({trained / 1e6:.2f}M trained), vocab "
          f"{tokenizer.vocab_size}, {len(train_data)} train / {len(eval_data)} eval "
          f"demonstrations, device {device}")

    # ---- optimizer
    groups = [dict(g, lr=cfg.lr) for g in model.optim_groups(cfg.weight_decay)]
    optimizer = Optimizer(groups, dtype, device, cfg.grad_clip)
    batch_gen = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
        batch_gen.set_state(resumed["batch_rng"])
        restore_rank_rng(resumed, ckpt_path)
        step = resumed["step"]
    log = MetricsLog(cfg.out_dir, resume_step=step if resumed else None,
                     time_offset=resumed["time"] if resumed else 0.0)

    def evaluate(step: int) -> dict:
        figures = {"eval_loss": eval_loss(model, eval_data, cfg.batch_size, device, ctx)}
        if env_class is not None:  # held-out episodes, played as RL will play them
            gen = torch.Generator(device=device).manual_seed(cfg.seed + step)
            source = EpisodeSource(env_class, env_name, tokenizer, cfg.max_turns)
            with ctx:
                played, transcripts = play_and_measure(model, source, range(cfg.eval_prompts),
                                                       cfg, cfg.batch_size, gen)
            figures.update(played)
            for transcript in transcripts[:2]:
                tqdm.write("  " + " | ".join(f"{role} {text}" for role, text in transcript))
        if task is not None:
            gen = torch.Generator(device=device).manual_seed(cfg.seed + step)
            with ctx:
                responses = sample_responses(model, tokenizer, eval_prompts, cfg.max_new_tokens,
                                             cfg.temperature, generator=gen)
            report = policy_report(task, eval_prompts, responses)
            figures.update(well_formed=report["well_formed"], gold=report["gold"])
            for p, r in list(zip(eval_prompts, responses))[:3]:
                tqdm.write(f"  [{p}] {r}")
        log.log(step, split="eval", **figures)
        tqdm.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        return figures

    def save(step: int):
        save_checkpoint(ckpt_path, {
            "stage": "sft", "model": weights_for_later_stages(model),
            "model_config": asdict(model.config), "resume": resume_state(model),
            "tokenizer": tokenizer.state_dict(), "optimizer": optimizer.state_dict(),
            "step": step, "rng": rank_rng_states(), "batch_rng": batch_gen.get_state(),
            "time": log.elapsed(), "config": asdict(cfg)})

    # ---- loop
    model.train()
    bar = tqdm(range(step, cfg.max_iters), initial=step, total=cfg.max_iters, desc="sft",
               dynamic_ncols=True, disable=not is_main())
    for step in bar:
        scale = lr_at(step, cfg.max_iters, 1.0, cfg.warmup_iters, "cosine", min_ratio=0.1)
        optimizer.set_lr_scale(scale)
        lr = cfg.lr * scale
        loss = 0.0
        for _ in range(cfg.grad_accum):  # micro-batches: their gradients add up
            # every rank draws the same world x batch_size rows and trains on its own slice
            idx = torch.randint(len(train_data), (cfg.batch_size * world,), generator=batch_gen)
            inputs, targets = train_data.batch(shard(idx.tolist(), cfg.batch_size))
            share = 1.0
            if world > 1:  # the loss is a mean over the target tokens of all ranks: weigh this
                # rank's mean by its share of them, so the averaged gradients are one process's
                share = token_share(targets != IGNORE)
            with ctx:
                micro = lm_loss(model, inputs.to(device), targets.to(device)) * share / cfg.grad_accum
            optimizer.backward(micro)
            loss = loss + micro.detach()
        optimizer.step()
        if step % 10 == 0:
            loss = all_sum(loss) / world  # the whole batch's loss, as one process would log it
            log.log(step, loss=loss.item(), lr=lr)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % cfg.eval_interval == 0 and step + 1 < cfg.max_iters:
            if is_main():
                evaluate(step + 1)
            save(step + 1)
    bar.close()

    final = evaluate(cfg.max_iters) if is_main() else {}
    save(cfg.max_iters)
    summary = log.log(cfg.max_iters, final=True, **final, skipped_updates=optimizer.skipped)
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    picture_of_run(cfg.out_dir)
    shutdown()
    return summary


if __name__ == "__main__":
    run(main, Config)
