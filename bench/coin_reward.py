"""A reward that says nothing: a fair coin per response (bench/spurious.py).

    python train_ppo.py --task sort --algo grpo --reward bench/coin_reward.py:coin

Each response scores 1 or 0 with probability 1/2, independently of the prompt and of what it
says, from a generator seeded once (COIN_SEED, default 0), so a run is reproducible from its
start (a resumed run draws a new sequence).
"""
import os
import random

RNG = random.Random(int(os.environ.get("COIN_SEED", "0")))


def coin(prompts, responses, **fields):
    return [float(RNG.random() < 0.5) for _ in responses]
