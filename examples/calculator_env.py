"""A tool as an environment: a calculator the policy may call before it answers.

    python train_ppo.py --env examples/calculator_env.py:Calculator ...   (docs/multiturn.md)

The opening asks for a product of two numbers. The policy either calls the tool, writing
"calc X * Y" (the reply is the tool's output, the product), or answers, writing "answer N"
(the episode ends: reward 1 if N is right, else 0). Anything else gets a reminder of the
format and costs 0.1. A policy needs demonstrations of such episodes first (SFT on
{"turns": [...]} lines), so that its tokenizer has the words and it knows the format.
"""
import random


class Calculator:
    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.a, self.b = rng.randint(10, 99), rng.randint(10, 99)
        return f"what is {self.a} times {self.b} ? ask calc X * Y or answer N :"

    def step(self, action: str) -> tuple[str, float, bool]:
        words = action.split()
        if len(words) == 4 and words[0] == "calc" and words[2] == "*":
            try:
                return str(int(words[1]) * int(words[3])), 0.0, False  # the tool runs
            except ValueError:
                return "error", 0.0, False
        if len(words) == 2 and words[0] == "answer":
            return "ok", float(words[1] == str(self.a * self.b)), True
        return "say calc X * Y or answer N", -0.1, False
