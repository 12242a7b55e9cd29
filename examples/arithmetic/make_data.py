"""Write the arithmetic example's data: two-digit additions, each prompt with its reference
answer, and demonstrations from a teacher who is wrong on 30 % of them.

    python examples/arithmetic/make_data.py        # rewrites the four .jsonl files beside it

    prompt:  "3 4 + 1 7 ="       answer / response:  "5 1"      (digits as words)

- prompts.jsonl (train) and eval.jsonl (held out): {"prompt": ..., "answer": ...}. The
  "answer" field is what `train_ppo.py --prompts` passes to the reward function by name
  (reward.py). Held out means the pair of numbers: no eval problem is in training, in either
  order.
- demos.jsonl: {"prompt", "response"} demonstrations of the training problems for
  train_sft.py; on 30 % of them the teacher's last digit is off by one, so SFT learns to
  answer in the right form and is right about as often as the teacher, and only RL against
  the exact answer can go past it.
- demos_eval.jsonl: demonstrations of the held-out problems (right ones), for SFT's eval loss.

The same files every time (a fixed seed); numbers 0-49, so 1,275 problems up to order.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TEACHER_ERROR = 0.3


def digits(n: int) -> str:
    return " ".join(str(n))


def prompt_of(a: int, b: int) -> str:
    return f"{digits(a)} + {digits(b)} ="


def teacher(rng: random.Random, a: int, b: int) -> str:
    total = a + b
    if rng.random() < TEACHER_ERROR:  # last digit off by one, never below 0
        total = total + 1 if total % 10 == 0 or rng.random() < 0.5 else total - 1
    return digits(total)


def write(name: str, rows: list[dict]) -> None:
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main():
    rng = random.Random(0)
    pairs = [(a, b) for a in range(50) for b in range(a, 50)]  # unordered problems
    rng.shuffle(pairs)
    held_out, train = pairs[:150], pairs[150:]
    both_orders = lambda ps: [(a, b) for a, b in ps] + [(b, a) for a, b in ps if a != b]  # noqa: E731
    train, held_out = both_orders(train), both_orders(held_out)
    write("prompts.jsonl", [{"prompt": prompt_of(a, b), "answer": digits(a + b)} for a, b in train])
    write("eval.jsonl", [{"prompt": prompt_of(a, b), "answer": digits(a + b)} for a, b in held_out])
    write("demos.jsonl", [{"prompt": prompt_of(a, b), "response": teacher(rng, a, b)}
                          for a, b in (rng.choice(train) for _ in range(8000))])
    write("demos_eval.jsonl", [{"prompt": prompt_of(a, b), "response": digits(a + b)}
                               for a, b in held_out])


if __name__ == "__main__":
    main()
