"""Sample from a trained policy: one prompt, a file of prompts, or an interactive loop.

    python sample.py --ckpt_dir out/ppo --prompt "the plot was"
    python sample.py --ckpt_dir out/ppo --prompts prompts.jsonl --num_samples 4
    python sample.py --ckpt_dir out/ppo --compare out/sft --rm_dir out/rm --prompt "the cast felt"
    python sample.py --ckpt_dir out/ppo      # no --prompt, a terminal: one prompt per line
    python sample.py --ckpt_dir out/guess/grpo --env guess --num_samples 3   # 3 whole episodes
    python sample.py --ckpt_dir out/guess/grpo --play_env   # you are the environment
    python sample.py --init_from ~/models/SmolLM2-135M --prompt "The capital of France is"
    python sample.py --ckpt_dir out/ppo --prompts prompts.jsonl --num_samples 4 --out teacher.jsonl
        # the responses as demonstrations: python train_sft.py --data teacher.jsonl (distillation
        # from a teacher's samples, off-policy; docs/distill.md)

Any checkpoint a policy stage writes works: SFT, PPO, GRPO, RLOO, DPO (LoRA runs save merged
weights). A reward model's checkpoint is not a policy and is refused. `--compare DIR` samples a
second policy on the same prompts with the same seed and prints the two side by side;
`--rm_dir` adds the reward model's score of each response, and on the built-in task (word
tokenizer) the gold reward is printed too.

With `--env` the policy plays episodes with an environment (docs/multiturn.md): held-out
seeds --env_seed, --env_seed + 1, ..., each printed as the whole dialogue with its return and
turns. With `--play_env` a person plays the environment's part: type the opening, then a reply
after each of the policy's turns; an empty line ends the episode.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from mingpt_rlhf.stages import load_policy, load_reward_model
from mingpt_rlhf.machinery.cli import opt, require_positive, run
from mingpt_rlhf.machinery.chat import chat_format_of
from mingpt_rlhf.data import load_prompts_jsonl, sequence_start
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.evaluate import generate_batches, response_texts
from mingpt_rlhf.machinery.runtime import pick_device
from mingpt_rlhf.tasks import get_task, task_of_tokenizer
from mingpt_rlhf.tokenizer import WordTokenizer, same_tokenizer


@dataclass
class Config:
    ckpt_dir: str = opt("out/ppo", "folder of the policy to sample (SFT, PPO, GRPO, RLOO or DPO)")
    init_from: str = opt("", "sample published weights instead of --ckpt_dir: a GPT-2 name, or a "
                             "folder of GPT-2, Llama 3 / SmolLM2, Qwen2 / 2.5 or Qwen3")
    prompt: str = opt("", "one prompt, as it is (none: read --prompts, or prompts typed one per "
                          "line)")
    prompts: str = opt("", "JSONL file of {prompt} or {messages} lines to answer (messages: "
                           "rendered in the model's chat format)")
    num_samples: int = opt(1, "responses per prompt")
    max_new_tokens: int = opt(32, "longest response, in tokens")
    temperature: float = opt(1.0, "sampling temperature (> 0; lower is more conservative)")
    top_k: int = opt(0, "sample among the k likeliest tokens only (0 = all)")
    top_p: float = opt(1.0, "sample from the smallest set of tokens whose probability reaches p (1 = all)")
    seed: int = opt(1337, "random seed (the same seed gives the same responses)")
    compare: str = opt("", "a second policy folder, sampled on the same prompts for comparison")
    rm_dir: str = opt("", "a reward model folder: print its score of each response")
    task: str = opt("auto", "built-in task whose check (gold reward) is printed for each "
                            "response: auto (the task whose vocabulary the policy has) | "
                            "reviews | sort")
    device: str = opt("auto", "auto | cpu | cuda | mps")
    env: str = opt("", "play episodes with an environment (built-in: guess; or FILE.py:CLASS): "
                       "--num_samples episodes of held-out seeds from --env_seed")
    env_seed: int = opt(0, "with --env: the first episode's seed")
    max_turns: int = opt(8, "with --env or --play_env: most policy turns per episode")
    play_env: bool = opt(False, "you play the environment: type the opening and each reply "
                                "(an empty line ends the episode)")
    out: str = opt("", "also write --ckpt_dir's responses as demonstrations to this JSONL file, "
                       "one {\"prompt\", \"response\"} line each, EOS left out, which train_sft.py "
                       "--data reads (with --prompt or --prompts; responses cut off at "
                       "--max_new_tokens without EOS are left out, and counted)")


def load_sampler(folder: str, device, flag: str, init_from: str = ""):
    """(policy, tokenizer) from a policy checkpoint folder (load_policy refuses a reward model),
    or from published weights (`init_from`)."""
    policy, tokenizer, _ = load_policy(folder, init_from, flag=flag)
    return policy.to(device), tokenizer


def check_config(cfg: Config) -> None:
    require_positive(cfg, "num_samples", "max_new_tokens", "temperature")
    if cfg.top_k < 0 or not 0 < cfg.top_p <= 1:
        raise UserError("--top_k must be >= 0 and --top_p in (0, 1]")
    if cfg.prompt and cfg.prompts:
        raise UserError("pass --prompt or --prompts, not both")
    require_positive(cfg, "max_turns")
    if (cfg.env or cfg.play_env) and (cfg.prompt or cfg.prompts or cfg.rm_dir):
        raise UserError("--env and --play_env play episodes; drop --prompt, --prompts and --rm_dir")
    if cfg.env and cfg.play_env:
        raise UserError("pass --env (an environment plays its part) or --play_env (you do), "
                        "not both")
    if cfg.out and not (cfg.prompt or cfg.prompts):
        raise UserError("--out writes the answers to --prompt or --prompts: pass one of them")


class Answerer:
    """Samples each loaded policy on a list of prompts and formats the answers."""

    def __init__(self, cfg: Config):
        self.cfg, device = cfg, pick_device(cfg.device)
        name = cfg.init_from or cfg.ckpt_dir
        self.policies = [(name, *load_sampler(cfg.ckpt_dir, device, "--ckpt_dir", cfg.init_from))]
        if cfg.compare:
            self.policies.append((cfg.compare, *load_sampler(cfg.compare, device, "--compare")))
            if not same_tokenizer(self.policies[0][2], self.policies[1][2]):
                raise UserError(f"{cfg.compare} uses another tokenizer than {cfg.ckpt_dir}; "
                                "compare policies trained from the same SFT run")
        self.rm = load_reward_model(cfg.rm_dir, self.policies[0][2], cfg.ckpt_dir).to(device) \
            if cfg.rm_dir else None
        tokenizer = self.policies[0][2]
        self.task = (task_of_tokenizer(tokenizer) if cfg.task == "auto" else
                     get_task(cfg.task) if isinstance(tokenizer, WordTokenizer) else None)

    def answer(self, prompts: list[str]) -> list[dict]:
        """One row per (prompt, sample): the prompt and, per policy, response and scores."""
        cfg = self.cfg
        for name, policy, tokenizer in self.policies:
            for p in prompts:
                ids = tokenizer.encode(p)
                if not ids:
                    raise UserError(f"the prompt {p!r} has no tokens; type some text")
                n = len(sequence_start(tokenizer, ids))  # with a BOS, if the tokenizer has one
                if n + cfg.max_new_tokens > policy.config.block_size:
                    raise UserError(f"the prompt {p[:40]!r} ({n} tokens) + --max_new_tokens "
                                    f"{cfg.max_new_tokens} exceeds the block_size "
                                    f"{policy.config.block_size} of {name}; shorten either")
        repeated = [p for p in prompts for _ in range(cfg.num_samples)]
        rows = [{"prompt": p} for p in repeated]
        self.demonstrations = []  # --ckpt_dir's responses that ended with EOS, EOS left out
        for name, policy, tokenizer in self.policies:
            generator = torch.Generator(next(policy.parameters()).device).manual_seed(cfg.seed)
            texts, scores = [], []
            for out in generate_batches(policy, tokenizer, repeated, cfg.max_new_tokens,
                                        temperature=cfg.temperature, top_k=cfg.top_k or None,
                                        top_p=cfg.top_p if cfg.top_p < 1 else None,
                                        generator=generator):
                if name == cfg.ckpt_dir:
                    self.demonstrations += demonstrations_of(tokenizer, out)
                texts += response_texts(tokenizer, out)
                if self.rm is not None:
                    with torch.no_grad():
                        scores += self.rm(out.sequences, out.attention_mask).float().tolist()
            for i, (row, text) in enumerate(zip(rows, texts)):
                entry = {"response": text}
                if self.rm is not None:
                    entry["rm_score"] = round(scores[i], 3)
                if self.task is not None:
                    entry["gold"] = round(self.task.gold_reward(row["prompt"], text), 3)
                row[name] = entry
        return rows

    def show(self, rows: list[dict], out=sys.stdout) -> None:
        for row in rows:
            print(f"[{row['prompt']}]", file=out)
            for name, _, _ in self.policies:
                entry = row[name]
                figures = "".join(f"  {k} {entry[k]:+.3f}" for k in ("rm_score", "gold") if k in entry)
                label = f"{name}: " if len(self.policies) > 1 else ""
                print(f"  {label}{entry['response']}{figures}", file=out)


def demonstrations_of(tokenizer, out) -> list[str | None]:
    """Each row's response as a demonstration's text: its tokens up to EOS, EOS left out (SFT
    appends its own); None for a response cut off without EOS (as a demonstration it would
    teach to stop where it was cut)."""
    T = out.prompt_len
    rows = []
    for ids, keep in zip(out.sequences[:, T:].tolist(), out.action_mask[:, T:].tolist()):
        tokens = [t for t, k in zip(ids, keep) if k]
        ended = bool(tokens) and tokens[-1] == tokenizer.eos_id
        rows.append(tokenizer.decode(tokens[:-1]) if ended else None)
    return rows


def write_demonstrations(path: str, prompts: list[str], responses: list[str | None], out) -> None:
    """The {"prompt", "response"} lines of the responses that ended, written atomically."""
    import json
    import os
    kept = [(p, r) for p, r in zip(prompts, responses) if r is not None]
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in kept)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e}); pass another --out") from None
    print(f"wrote {len(kept)} demonstrations to {path} ({len(responses) - len(kept)} cut off at "
          f"--max_new_tokens without EOS, left out)", file=out)


def person_as_environment(stdin, out):
    """An environment class whose part a person plays, reading the opening and each reply
    from `stdin` (an empty line or the end of input ends the episode, reward 0)."""
    interactive = stdin.isatty()

    def ask(prompt: str) -> str:
        if interactive:
            print(prompt, end="", file=out, flush=True)
        return stdin.readline().strip()

    class Person:
        def reset(self, seed):
            text = ask("opening> ")
            if not text:
                raise UserError("no opening typed: type the environment's first words")
            return text

        def step(self, action):
            print(f"policy: {action}", file=out, flush=True)
            reply = ask("reply> ")
            return (reply or "(end)"), 0.0, not reply
    return Person


def play(cfg: Config, stdin, out) -> list[dict]:
    """--env / --play_env: play episodes with each policy and print their dialogues."""
    from mingpt_rlhf.methods.episodes import EpisodeSource, load_env, transcript_text
    device = pick_device(cfg.device)
    env_class, name = (person_as_environment(stdin, out), "you") if cfg.play_env else load_env(cfg.env)
    seeds = [0] if cfg.play_env else list(range(cfg.env_seed, cfg.env_seed + cfg.num_samples))
    sources = [(cfg.ckpt_dir, "--ckpt_dir", cfg.init_from)] + ([(cfg.compare, "--compare", "")]
                                                                if cfg.compare else [])
    rows = []
    for folder, flag, init_from in sources:
        policy, tokenizer = load_sampler(folder, device, flag, init_from)
        folder = init_from or folder
        source = EpisodeSource(env_class, name, tokenizer, cfg.max_turns)
        generator = torch.Generator(device).manual_seed(cfg.seed)
        ep = source.play(policy, seeds, cfg, generator)
        for i, seed in enumerate(seeds):
            row = {"policy": folder, "seed": seed, "return": ep.returns[i].item(),
                   "turns": int(ep.turns[i]), "ended_by": ep.ended_by[i],
                   "transcript": ep.transcripts[i]}
            rows.append(row)
            if not cfg.play_env:
                label = f"{folder}, " if cfg.compare else ""
                print(f"[{label}episode seed {seed}: return {row['return']:+.2f}, {row['turns']} "
                      f"turns, ended by {row['ended_by']}]", file=out)
                print(transcript_text(row["transcript"]), file=out)
    return rows


def main(cfg: Config, stdin=None, out=None):
    stdin, out = stdin or sys.stdin, out or sys.stdout
    check_config(cfg)
    if cfg.env or cfg.play_env:
        return play(cfg, stdin, out)
    answerer = Answerer(cfg)
    chat = chat_format_of(answerer.policies[0][2])  # a messages line is rendered in its format
    prompts = [cfg.prompt] if cfg.prompt else load_prompts_jsonl(cfg.prompts, chat) if cfg.prompts else None
    if prompts is not None:
        rows = answerer.answer(prompts)
        answerer.show(rows, out)
        if cfg.out:
            write_demonstrations(cfg.out, [r["prompt"] for r in rows], answerer.demonstrations, out)
        return rows
    # no prompt given: one prompt per line from stdin (a terminal or a pipe); empty line or EOF ends
    interactive = stdin.isatty()
    rows = []
    while True:
        if interactive:
            print("prompt> ", end="", file=out, flush=True)
        line = stdin.readline()
        if not line.strip():
            break
        try:
            answered = answerer.answer([line.strip()])
        except UserError as e:  # a prompt that does not fit: say so and take the next one
            print(f"error: {e}", file=sys.stderr)
            continue
        answerer.show(answered, out)
        rows += answered
    return rows


if __name__ == "__main__":
    run(main, Config)
