"""How much would TF32 move the log-probs of GPT-2's output layer? (The output layer runs in
strict float32 with TF32 off, the slowest matmul of the model on an H100.)

TF32 multiplies float32 operands rounded to a 10-bit mantissa and accumulates in float32. On
a CPU that is emulated exactly by rounding both operands (round to nearest even) and doing
the matmul in float32. Compared, per token, against the strict float32 log-probs:
- tf32:        hidden states and weights rounded to TF32;
- bf16_trunk:  the hidden states rounded to bf16 once (the least a bf16 autocast trunk has
               already done to them before the output layer sees them), matmul in float32;
- bf16_logits: logits computed in bf16 (what autocast would do without model.logits' guard).
GPT-2-small shapes: 768 wide, 50,257 ids. Without GPT-2's weights here, the weights are
N(0, 0.14) (GPT-2's wte has std ~0.14) and the hidden states a LayerNorm output with gains
N(1, 0.3) plus 4 outlier dimensions of gain 20 (GPT-2's final hidden states have a few large
dimensions): an assumption, stated in the JSON.

    python bench/tf32_logprobs.py        # writes bench/results/tf32_logprobs.json
"""
import json
import os
import time

import torch


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 -> the nearest float32 with only `bits` mantissa bits (ties to even)."""
    drop = 23 - bits
    i = x.contiguous().view(torch.int32)
    lsb = (i >> drop) & 1
    i = (i + (1 << (drop - 1)) - 1 + lsb) & ~((1 << drop) - 1)
    return i.view(torch.float32)


def main():
    torch.manual_seed(0)
    V, C, N = 50257, 768, 512
    weight = torch.randn(V, C) * 0.14
    gain = 1 + 0.3 * torch.randn(C)
    gain[:4] = 20.0
    hidden = torch.nn.functional.layer_norm(torch.randn(N, C), (C,)) * gain
    tokens = torch.randint(V, (N,))

    def logprobs(h, w, dtype=torch.float32):
        logits = (h.to(dtype) @ w.to(dtype).T).float()
        return torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)

    exact = logprobs(hidden, weight)
    variants = {
        "tf32": logprobs(round_mantissa(hidden, 10), round_mantissa(weight, 10)),
        "bf16_trunk": logprobs(hidden.bfloat16().float(), weight),
        "bf16_logits": logprobs(hidden, weight, torch.bfloat16),
    }
    result = {"shape": {"rows": N, "n_embd": C, "vocab": V},
              "assumption": "random weights N(0, 0.14); hidden = LayerNorm x gain N(1, 0.3), "
                            "4 dims of gain 20",
              "logit_std": float((hidden @ weight.T).std()),
              "abs_logprob_error_vs_float32": {}}
    for name, lp in variants.items():
        err = (lp - exact).abs()
        result["abs_logprob_error_vs_float32"][name] = {
            "mean": float(err.mean()), "p99": float(err.quantile(0.99)), "max": float(err.max())}
    # the sanity check of the emulation: 10 bits keep |x - round(x)| <= 2^-11 |x|
    x = torch.randn(10000)
    result["emulation_max_relative_rounding"] = float(((round_mantissa(x, 10) - x) / x).abs().max())
    result["date"] = time.strftime("%Y-%m-%d")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", "tf32_logprobs.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
