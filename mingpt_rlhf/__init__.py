"""mingpt_rlhf: supervised fine-tuning, a reward model and PPO, from scratch in plain PyTorch."""
