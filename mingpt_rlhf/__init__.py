"""mingpt_rlhf: supervised fine-tuning, a reward model and PPO, from scratch in plain PyTorch.

The recipe is this folder, in reading order:

    model.py        the GPT: GPT-2's architecture and parameter names, padding mask, KV cache;
                    the parts today's families swap in (rotary, RMSNorm, SwiGLU, grouped k/v)
    tokenizer.py    one tokenizer interface: the built-in word tokenizer (and byte-level BPE)
    data.py         JSONL readers with validation, padding and batching, the SFT loss mask
    task_base.py    what a built-in task is: prompts, demonstrations, preference pairs, gold
    tasks.py        the built-in tasks ("reviews"), where the "human" data comes from
    task_sort.py    a task a program can check: sort a few digits
    rewards.py      where an RL reward comes from: the reward model, the task's check, a function
    sampling.py     batched generation: temperature, top-k, top-p, EOS, left padding, KV cache
    logprobs.py     log-probabilities of the tokens a model wrote, in little memory
    heads.py        the reward model (a score per sequence), the critic (a value per token)
    stages.py       a stage's checkpoint read back as the next stage's models
    optim.py        the optimizer step every stage shares
    ppo.py          the math of PPO: experience, KL-shaped rewards, GAE, clipped losses
    losses.py       every way a rollout becomes a loss, by name: one table per role
    ppo_trainer.py  one RL iteration: make experience, then epochs x minibatches
    evaluate.py     sample from a policy on held-out prompts and measure the responses
    decode_graphs.py  sampling's loop with fixed shapes, replayed as a CUDA graph (off by default)

Beside it: methods/ (the methods beside PPO: GRPO and RLOO, DPO, online DPO, distillation,
best-of-n, episodes with an environment) and lab/ (the studies' modules); below it machinery/
(what the recipe stands on: processes, padding-free passes, LoRA, checkpoint files, the command
line, published weights and tokenizers, chat formats), which imports nothing of the recipe;
above it run/ (what runs it: the RL options, the run's warnings, logs, curves, the report, the
export), which nothing of the recipe imports. The scripts at the repository's root
(train_sft.py, train_rm.py, train_ppo.py, train_dpo.py, sample.py) run it.
"""
