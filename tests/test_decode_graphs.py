"""decode_graphs.py: the decoding step of fixed shapes gives sampling.py's tokens.

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
from mingpt_rlhf import decode_graphs
from mingpt_rlhf.decode_graphs import CHECK_EVERY, DecodeGraphs, what_a_graph_reads
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


@pytest.mark.parametrize("name", ["gpt2", "qwen3_tiny"])
def test_under_bf16_autocast_the_differences_are_bf16s_rounding(name, tiny_gpt):
    """Under bf16 autocast (the GPU's default; on a CPU it stands in for it) the step runs in
    the cache's dtype (Qwen3's normed keys come out float32 and are stored as bf16, as
    KVCache stores them), and the masked buffer moves attention's bf16 rounding: each
    log-prob moves by up to ~0.02 nats here, so a later draw can differ. Compared up to the
    first column where the two loops' tokens part (the first token comes from the same
    prompt pass: never)."""
    model = tiny_gpt if name == "gpt2" else GPT.from_pretrained(str(FIXTURES / name))
    eos = 1 if name == "gpt2" else model.config.vocab_size - 1
    ids, mask = prompts(model.config.vocab_size, eos)
    for seed in range(3):
        outs = []
        for loop in (None, DecodeGraphs()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs.append(generate(model, ids, mask, max_new_tokens=16, eos_token_id=eos,
                                     pad_token_id=0, score=True, loop=loop,
                                     generator=torch.Generator().manual_seed(seed)))
        eager, fixed = outs
        width = min(eager.responses.size(1), fixed.responses.size(1))
        parted = (eager.responses[:, :width] != fixed.responses[:, :width]).any(0).tolist()
        same = parted.index(True) if True in parted else width
        assert same >= 1
        torch.testing.assert_close(fixed.logprobs[:, :same], eager.logprobs[:, :same], rtol=0,
                                   atol=0.05)


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
    adapters off, or TF32's switch change it (a capture again)."""
    from mingpt_rlhf.lab.offpolicy import SamplerQueue
    from mingpt_rlhf.machinery.lora import adapters_disabled, add_lora
    from mingpt_rlhf.machinery.runtime import hold_frozen_in, tf32_matmuls
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
    with tf32_matmuls():  # the process-wide switch of CUDA's float32 matmuls
        assert what_a_graph_reads(model) != reads
    frozen = copy.deepcopy(model)
    frozen_reads = what_a_graph_reads(frozen)
    hold_frozen_in(frozen, torch.bfloat16)
    assert what_a_graph_reads(frozen) != frozen_reads


# ----------------------------------------------------------------------------- on CUDA
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_sample(model, loop, ids, mask, amp, seed=0, **kw):
    """generate on CUDA (bf16 autocast if `amp`, as PPO samples) from a seeded CUDA
    generator, with scores: (output, the generator's state after)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        out = generate(model, ids, mask, max_new_tokens=kw.pop("max_new_tokens", 40),
                       generator=g, score=True, loop=loop, **kw)
    return out, g.get_state()


def same_on_cuda(a, b, exact=True):
    """Tokens and masks equal; scores bit for bit (`exact`: the same kernels), else to 1e-5."""
    assert torch.equal(a.sequences, b.sequences), (a.sequences, b.sequences)
    assert torch.equal(a.action_mask, b.action_mask)
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=0, atol=SCORES_ATOL)
    for name in ("logprobs", "entropy", "hidden"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), **tol)


def cuda_prompts(vocab, eos):
    ids, mask = prompts(vocab, eos)
    return ids.cuda(), mask.cuda()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["gpt2", "qwen3_tiny"])
@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16"])
def test_graph_replays_are_the_eager_steps_on_cuda(name, amp):
    """A captured step replays what the same step run eagerly computes, bit for bit, from the
    same generator, which ends where the eager run left it; one capture serves a second call.
    In float32 the tokens are also sampling.py's (its scores to 1e-5)."""
    torch.manual_seed(0)
    model = (GPT(GPTConfig(vocab_size=97, block_size=128, n_layer=2, n_head=4, n_embd=64))
             if name == "gpt2" else GPT.from_pretrained(str(FIXTURES / name))).cuda().eval()
    eos = model.config.vocab_size - 1
    ids, mask = cuda_prompts(model.config.vocab_size, eos)
    kw = dict(eos_token_id=eos, pad_token_id=0, top_k=None)
    graphs = DecodeGraphs()
    first, state_first = cuda_sample(model, graphs, ids, mask, amp, **kw)   # captures
    again, state_again = cuda_sample(model, graphs, ids, mask, amp, **kw)   # replays only
    eager, state_eager = cuda_sample(model, DecodeGraphs(capture=False), ids, mask, amp, **kw)
    assert len(graphs.captures) == 1, graphs.captures
    same_on_cuda(first, eager)
    same_on_cuda(again, eager)
    assert torch.equal(state_first, state_eager) and torch.equal(state_again, state_eager)
    if not amp:
        same_on_cuda(eager, cuda_sample(model, None, ids, mask, amp, **kw)[0], exact=False)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_a_graph_captured_before_updates_samples_the_weights_after(lora):
    """Captured once, then: an optimizer step (weights updated in place), a lagging sampler's
    swap of older weights in and out (in place), LoRA's adapters off (the reference's
    policy), and casts of frozen weights to bf16 (new tensors: LoRA's base in the actor, a
    frozen copy as the reference is held): each call equals the eager step of the weights it
    should read; only a switch of the adapters or a cast captures again."""
    from mingpt_rlhf.lab.offpolicy import SamplerQueue
    from mingpt_rlhf.machinery.lora import adapters_disabled, add_lora
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    from mingpt_rlhf.optim import Optimizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=97, block_size=128, n_layer=2, n_head=4, n_embd=64)).cuda()
    if lora:
        add_lora(model, lora, 8.0)
        for m in model.modules():  # adapters that already act, so that switching them off shows
            if hasattr(m, "lora_B"):
                torch.nn.init.normal_(m.lora_B, std=0.5)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = Optimizer([{"params": params, "lr": 0.05, "weight_decay": 0.0}], torch.bfloat16,
                    torch.device("cuda"))
    ids, mask = cuda_prompts(97, eos=96)
    kw = dict(eos_token_id=96, pad_token_id=0)
    graphs, eager = DecodeGraphs(), DecodeGraphs(capture=False)

    def check(captures, sampler=model):
        a, _ = cuda_sample(sampler, graphs, ids, mask, True, **kw)
        b, _ = cuda_sample(sampler, eager, ids, mask, True, **kw)
        same_on_cuda(a, b)
        assert len(graphs.captures) == captures, graphs.captures
        return a
    before = check(1)
    old = [p.detach().clone() for p in params]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, mask).float().logsumexp(-1).mean()
    opt.backward(loss)
    opt.step()
    after = check(1)
    assert not torch.equal(after.sequences, before.sequences)  # the step changed the samples
    queue = SamplerQueue(1)
    queue.push(old)
    with queue.sampling(model, for_update=True):
        swapped = check(1)
    same_on_cuda(swapped, before)  # the old weights' samples again
    assert torch.equal(check(1).sequences, after.sequences)  # and swapped back out
    n = 1
    if lora:
        with adapters_disabled(model):
            assert not torch.equal(check(2).sequences, after.sequences)
        check(3)  # adapters on again: what the graph reads changed back, captured again
        n = 3
    frozen = copy.deepcopy(model).requires_grad_(False)  # as the reference is held
    check(n + 1, frozen)  # a model of its own: its own graph
    hold_frozen_in(frozen, torch.bfloat16)
    check(n + 2, frozen)
    if lora:  # the actor's frozen base cast, as train_ppo.py holds it
        hold_frozen_in(model, torch.bfloat16)
        check(n + 3)
    print(f"\ncaptures: {graphs.captures}")
