"""machinery/decode_graphs.py: the decoding step of fixed shapes gives sampling.py's tokens.

On the CPU the step runs eagerly (no graph): the same greedy and sampled tokens, masks and
scores as sampling.py's loop, with left padding, EOS per row, top-k and top-p, for GPT-2 and
today's families; no host sync per token; what makes a graph stale is noticed. The `gpu` tests
at the end replay captured graphs on CUDA (skipped without one).

Why the tokens are compared exactly and the scores to 1e-5: the step attends over a longer
buffer whose extra columns are masked. They add exact zeros, but the sums are blocked
differently, so a logit can move in its last bits (float32: ~1e-6). A token changes only when
a uniform draw falls within that of a boundary between two tokens (or two greedy logits are
that close): for the seeds here none does, which the exact comparison checks; a new seed that
hit such a tie would fail with its step, and ties of that size are the only allowed cause.
"""
import copy
from pathlib import Path

import pytest
import torch

from conftest import left_pad
from mingpt_rlhf.machinery import decode_graphs
from mingpt_rlhf.machinery.decode_graphs import CHECK_EVERY, DecodeGraphs, what_a_graph_reads
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.sampling import generate

FIXTURES = Path(__file__).parent / "fixtures" / "models"
FAMILIES = ("llama_tiny", "qwen2_tiny", "qwen3_tiny")
SCORES_ATOL = 1e-5
# (temperature, top_k, top_p, score): greedy, plain, top-k, top-p, both
SAMPLING = [(0.0, None, None, False), (1.0, None, None, True), (0.8, 5, None, True),
            (1.3, None, 0.9, False), (1.0, 6, 0.8, True)]


def same_output(model, ids, mask, seed=0, **kw):
    """generate's output with sampling.py's loop and with the fixed-shape one (each from the
    same seed), compared: tokens and masks exactly, scores to SCORES_ATOL."""
    loop = kw.pop("loop", None) or DecodeGraphs()
    eager = generate(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kw)
    fixed = generate(model, ids, mask, generator=torch.Generator().manual_seed(seed), loop=loop,
                     **kw)
    assert torch.equal(fixed.sequences, eager.sequences), (fixed.sequences, eager.sequences)
    assert torch.equal(fixed.attention_mask, eager.attention_mask)
    assert torch.equal(fixed.action_mask, eager.action_mask)
    if kw.get("score"):
        for name in ("logprobs", "entropy", "hidden"):
            torch.testing.assert_close(getattr(fixed, name), getattr(eager, name), rtol=0,
                                       atol=SCORES_ATOL)
    return eager


def prompts(vocab: int, eos: int):
    """Four left-padded prompts of 1 to 6 tokens, none holding EOS."""
    g = torch.Generator().manual_seed(1)
    rows = [[t if t != eos else 2 for t in torch.randint(2, vocab, (n,), generator=g).tolist()]
            for n in (6, 3, 1, 5)]
    return left_pad(rows, pad_id=0)


@pytest.mark.parametrize("temperature,top_k,top_p,score", SAMPLING)
def test_gpt2_same_tokens_as_the_eager_loop(tiny_gpt, temperature, top_k, top_p, score):
    """Left padding and EOS per row (rows end at different steps, one never): the same
    sequences, masks and scores, for several seeds."""
    ids, mask = prompts(17, eos=1)
    ended = []
    for seed in range(3):
        out = same_output(tiny_gpt, ids, mask, seed, max_new_tokens=20, temperature=temperature,
                          top_k=top_k, top_p=top_p, eos_token_id=1, pad_token_id=0, score=score)
        ended.append(out.action_mask.sum(-1).tolist())
    if temperature > 0:  # the comparison saw rows of several lengths
        assert len({n for lengths in ended for n in lengths}) > 2, ended


def test_no_eos_and_no_padding(tiny_gpt):
    """The path where sampling.py attends without a mask: every column real, max_new_tokens
    columns, a length that fills its bucket exactly."""
    ids = torch.randint(2, 17, (3, 64 - 24), generator=torch.Generator().manual_seed(3))
    same_output(tiny_gpt, ids, torch.ones_like(ids), max_new_tokens=24, score=True)


@pytest.mark.parametrize("name", FAMILIES)
def test_families_same_tokens_as_the_eager_loop(name):
    """Rotary positions from the table, grouped key/value heads, q/k norms, biases: greedy and
    sampled (with scores) tokens of each family's fixture, left-padded, EOS per row."""
    model = GPT.from_pretrained(str(FIXTURES / name))
    V = model.config.vocab_size
    eos = V - 1
    ids, mask = prompts(V, eos)
    for temperature, score in ((0.0, False), (1.0, True)):
        same_output(model, ids, mask, max_new_tokens=12, temperature=temperature,
                    eos_token_id=eos, pad_token_id=0, score=score)


def test_buffers_serve_batches_of_other_widths():
    """One loop, several calls: prompts of other widths in the same length bucket reuse the
    buffers (the earlier batch's keys in its columns are masked), a longer total gets a bucket
    of its own, and every call gives the eager loop's tokens."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=128, n_layer=2, n_head=2, n_embd=32)).eval()
    loop = DecodeGraphs()
    for width in (5, 2, 7, 70):
        ids = torch.randint(2, 17, (4, width), generator=torch.Generator().manual_seed(width))
        mask = torch.ones_like(ids)
        mask[0, :width - 1] = 0  # one row of a single token
        same_output(model, ids, mask, max_new_tokens=10, eos_token_id=1, pad_token_id=0,
                    score=True, loop=loop)
    assert sorted(length for (_, _, length, *rest) in loop.steps) == [64, 128]
    assert loop.captures == []  # nothing is captured on a CPU


def test_asks_the_host_once_per_check_not_per_token(tiny_gpt, monkeypatch):
    """The eager loop turns a tensor into a Python value after every token (its early stop);
    the fixed-shape loop only every CHECK_EVERY tokens, plus the prompt pass's question
    and the final count."""
    ids, mask = prompts(17, eos=16)  # an id these rows seldom draw: no early end
    asked = []
    for name in ("__bool__", "__int__", "item", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, **k:
                            (asked.append(1), _real(self, *a, **k))[1])

    def asks(loop):
        asked.clear()
        generate(tiny_gpt, ids, mask, max_new_tokens=33, eos_token_id=16, loop=loop,
                 generator=torch.Generator().manual_seed(0))
        return len(asked)
    eager, fixed = asks(None), asks(DecodeGraphs())
    assert eager >= 33
    assert fixed <= 2 + 33 // CHECK_EVERY, fixed


def test_stops_at_the_first_check_after_the_last_eos(tiny_gpt, monkeypatch):
    """A row that ends at its first token: the loop runs CHECK_EVERY - 1 steps past it (their
    tokens are padding) and the output is cut where sampling.py's loop stops, one column."""
    steps = []
    real = decode_graphs.FixedStep.forward
    monkeypatch.setattr(decode_graphs.FixedStep, "forward",
                        lambda self, g: (steps.append(1), real(self, g))[1])
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        first = int(tiny_gpt(ids)[0, -1].argmax())
    out = same_output(tiny_gpt, ids, torch.ones_like(ids), max_new_tokens=30, temperature=0.0,
                      eos_token_id=first, pad_token_id=0)
    assert out.responses.tolist() == [[first]]
    assert len(steps) == CHECK_EVERY - 1


def test_what_makes_a_captured_graph_stale():
    """A replay reads the weights where they were at capture. In-place writes (an optimizer
    step, a lagging sampler's swap) keep `what_a_graph_reads` (no capture again: the replay
    reads the new values); a cast to another tensor (hold_frozen_in), switching LoRA's
    adapters off, or the float32 matmul precision change it (a capture again)."""
    from mingpt_rlhf.lab.offpolicy import SamplerQueue
    from mingpt_rlhf.machinery.lora import adapters_disabled, add_lora
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=32, n_layer=1, n_head=2, n_embd=16))
    add_lora(model, 2, 4.0)
    reads = what_a_graph_reads(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.1)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    before = [p.detach().clone() for p in params]
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, params))
    assert what_a_graph_reads(model) == reads
    queue = SamplerQueue(1)
    queue.push(before)
    with queue.sampling(model, for_update=True):
        assert torch.equal(params[0], before[0]) and what_a_graph_reads(model) == reads
    with adapters_disabled(model):
        assert what_a_graph_reads(model) != reads
    assert what_a_graph_reads(model) == reads
    before = torch.get_float32_matmul_precision()  # the process-wide TF32 switch
    try:
        torch.set_float32_matmul_precision("high" if before == "highest" else "highest")
        assert what_a_graph_reads(model) != reads
    finally:
        torch.set_float32_matmul_precision(before)
    frozen = copy.deepcopy(model)
    frozen_reads = what_a_graph_reads(frozen)
    hold_frozen_in(frozen, torch.bfloat16)
    assert what_a_graph_reads(frozen) != frozen_reads
