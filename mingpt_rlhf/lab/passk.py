"""pass@k: the chance that at least one of k sampled answers to a problem is right.

    python -m mingpt_rlhf.lab.passk out/sort/grpo --task sort --n 1024 --k 1 4 16 64 256
    python -m mingpt_rlhf.lab.passk out/sort/sft --task sort --problems 200 --json sft.json

For each held-out problem of a task with an exact check (the sort task's), the policy samples
n answers at temperature 1 and c of them pass the check; pass@k is estimated without bias from
those n draws as

    pass@k = 1 - C(n - c, k) / C(n, k)

(the chance that k answers drawn without replacement from the n include a right one; Chen et
al. 2021), averaged over the problems. It needs n >= k, and is exact in expectation: sampling
k answers many times and counting a success when any is right converges to it (tested). The
product form below keeps it exact in floating point where the binomials would overflow.

pass@1 is the accuracy of one sample; pass@k at large k asks whether the policy can reach the
right answer at all. Comparing the curves of an SFT policy and an RL policy trained from it
shows whether RL taught new answers or made the likely ones likelier.
"""
from __future__ import annotations

import json
import os
import sys

import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are right: 1 - C(n-c, k) /
    C(n, k), computed without forming a binomial as whichever product is shorter:
    prod_{i = n-c+1}^{n} (1 - k / i) (c factors) or prod_{i = 0}^{k-1} (1 - c / (n - i))
    (k factors); both equal C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k answers holds a right one
        return 1.0
    miss = 1.0
    if c <= k:
        for i in range(n - c + 1, n + 1):
            miss *= 1.0 - k / i
    else:
        for i in range(k):
            miss *= 1.0 - c / (n - i)
    return 1.0 - miss


def pass_at_k_curve(counts: list[tuple[int, int]], ks: list[int]) -> dict[int, float]:
    """{k: mean over the problems of pass_at_k(n, c, k)} for (n, c) of each problem."""
    return {k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks}


@torch.no_grad()
def right_answers(model, tokenizer, task, prompts: list[str], n: int, max_new_tokens: int,
                  batch_size: int = 256, generator=None, progress=None) -> list[int]:
    """How many of n sampled answers to each prompt pass `task.check` (temperature 1, no
    top-k or top-p: the policy's own distribution)."""
    from ..evaluate import generate_batches, response_texts
    counts = []
    for prompt in prompts:
        right, left = 0, n
        while left:
            rows = min(batch_size, left)
            for out in generate_batches(model, tokenizer, [prompt] * rows, max_new_tokens, rows,
                                        generator=generator):
                right += sum(task.check(prompt, text) for text in response_texts(tokenizer, out))
            left -= rows
        counts.append(right)
        if progress is not None:
            progress.update(1)
    return counts


def build_parser():
    import argparse

    from ..machinery.cli import OneLineParser
    ap = OneLineParser(prog="python -m mingpt_rlhf.lab.passk", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", help="a checkpoint folder (SFT, PPO, GRPO, ...)")
    ap.add_argument("--task", default="sort", help="a built-in task with an exact check")
    ap.add_argument("--n", type=int, default=1024, help="answers sampled per problem")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                    help="the k of each pass@k (each from 1 to --n)")
    ap.add_argument("--problems", type=int, default=200, help="held-out problems (the first ones)")
    ap.add_argument("--max_new_tokens", type=int, default=16, help="the longest answer sampled")
    ap.add_argument("--seed", type=int, default=0, help="the sampling generator's seed")
    ap.add_argument("--json", default="", help="also write the result to this file")
    return ap


def measure(args) -> dict:
    """pass@k of `args.policy` on the task's first held-out problems (the CLI's options)."""
    from tqdm import tqdm

    from ..stages import load_policy
    from ..machinery.errors import UserError
    from ..tasks import get_task
    if args.n < 1 or args.problems < 1 or any(not 1 <= k <= args.n for k in args.k):
        raise UserError(f"--n and --problems must be >= 1 and each --k between 1 and --n "
                        f"({args.n}), got --problems {args.problems} --k {args.k}")
    task = get_task(args.task)
    if not hasattr(task, "check"):
        raise UserError(f"--task {args.task} has no exact check; pass@k needs one (--task sort)")
    model, tokenizer, _ = load_policy(args.policy, flag="policy")
    prompts = task.prompts("eval")[:args.problems]
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed)
    with tqdm(total=len(prompts), desc="pass@k", dynamic_ncols=True) as bar:
        counts = right_answers(model, tokenizer, task, prompts, args.n, args.max_new_tokens,
                               generator=generator, progress=bar)
    curve = pass_at_k_curve([(args.n, c) for c in counts], args.k)
    return {"policy": args.policy, "task": args.task, "n": args.n, "problems": len(prompts),
            "seed": args.seed, "right": counts, "pass_at_k": {str(k): v for k, v in curve.items()}}


def main(argv=None) -> dict:
    from ..machinery.errors import UserError
    args = build_parser().parse_args(argv)
    try:
        result = measure(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for k, v in result["pass_at_k"].items():
        print(f"pass@{k:<5s} {v:.4f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
