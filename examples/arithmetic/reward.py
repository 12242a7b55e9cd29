"""The arithmetic example's reward: 1.0 for the exact answer, else 0.0.

    python train_ppo.py --sft_dir out/arith/sft --prompts examples/arithmetic/prompts.jsonl \
        --eval_prompts_file examples/arithmetic/eval.jsonl --algo grpo \
        --reward examples/arithmetic/reward.py:exact --out_dir out/arith/grpo

`answer` is the "answer" field of each line of the prompts file: train_ppo.py passes every
field besides "prompt" to the function by name, one value per response, in order. Strict on
purpose: the answer's digits and then the end-of-sequence token, nothing before or after.
"""


def exact(prompts: list[str], responses: list[str], answer: list[str]) -> list[float]:
    return [float(response == f"{a} <eos>") for response, a in zip(responses, answer)]
