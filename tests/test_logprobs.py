"""Chunked log-probs (logprobs.py) against the plain log_softmax + gather, values and gradients."""
import pytest
import torch

from mingpt_rlhf.logprobs import lm_logprobs, lm_loss, sequence_logprobs, token_logprobs
from mingpt_rlhf.model import GPT, GPTConfig


@pytest.fixture
def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=37, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()


def reference(model, hidden, tokens, temperature=1.0, suppress=None):
    """The plain way: every logit, log_softmax over the vocabulary, gather."""
    logits = model.logits(hidden) / temperature
    if suppress is not None:
        logits = logits.masked_fill(torch.arange(logits.size(-1)) == suppress, float("-inf"))
    entropy = torch.special.entr(logits.softmax(-1)).sum(-1)  # -p log p, 0 where p = 0
    return token_logprobs(logits, tokens), entropy


@pytest.mark.parametrize("chunk_elements", [37 * 5, 10**9])  # 5 rows per chunk, or one chunk
def test_chunked_logprobs_and_entropy_equal_the_plain_ones(gpt, chunk_elements):
    hidden = torch.randn(3, 7, 16)
    tokens = torch.randint(1, 37, (3, 7))
    for temperature, suppress in [(1.0, None), (0.7, 0)]:
        lp, ent = lm_logprobs(gpt, hidden, tokens, temperature, suppress, "value", chunk_elements)
        ref_lp, ref_ent = reference(gpt, hidden, tokens, temperature, suppress)
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
        assert torch.isfinite(ent).all() and (ent >= 0).all()


def test_suppressed_id_has_probability_zero_and_the_rest_sums_to_one(gpt):
    hidden = torch.randn(4, 16)
    with torch.no_grad():
        gpt.lm_head.weight[0] = hidden.mean(0) * 50  # PAD would otherwise dominate
    all_ids = torch.arange(37).repeat(4, 1)                       # (4, 37): every id
    lp, _ = lm_logprobs(gpt, hidden[:, None].expand(4, 37, 16), all_ids, suppress=0)
    assert (lp[:, 0].exp() == 0).all()
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(4), atol=1e-5, rtol=0)


def test_recomputed_chunks_give_the_plain_gradients(gpt):
    """With gradients, chunks are recomputed in backward; the gradients must not change."""
    gpt.train()
    hidden0 = torch.randn(2, 9, 16)
    tokens = torch.randint(1, 37, (2, 9))
    weights = torch.randn(2, 9)
    grads = []
    for chunk_elements in [37 * 4, 10**9]:
        gpt.zero_grad()
        hidden = hidden0.clone().requires_grad_(True)
        lp, ent = lm_logprobs(gpt, hidden, tokens, 0.9, 0, "grad", chunk_elements)
        ((lp * weights).sum() + 0.1 * ent.sum()).backward()
        grads.append((hidden.grad.clone(), gpt.lm_head.weight.grad.clone()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_entropy_value_mode_passes_no_gradient(gpt):
    hidden = torch.randn(2, 3, 16, requires_grad=True)
    _, ent = lm_logprobs(gpt, hidden, torch.randint(0, 37, (2, 3)), entropy="value")
    assert not ent.requires_grad


def test_sequence_logprobs_shift_and_lm_loss(gpt):
    seq = torch.randint(1, 37, (2, 10))
    logits = gpt(seq)
    lp, _ = sequence_logprobs(gpt, seq, torch.ones_like(seq), start=4)
    torch.testing.assert_close(lp, token_logprobs(logits[:, 3:-1], seq[:, 4:]), atol=1e-5, rtol=0)
    targets = seq[:, 1:].clone()
    targets[0, :5] = -100  # ignored positions
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten())
    torch.testing.assert_close(lm_loss(gpt, seq[:, :-1], targets), expected, atol=1e-5, rtol=0)


def test_logits_are_float32_under_bf16_autocast(gpt):
    """bf16 logits step by 0.5 nats near -90; the output layer runs in float32 instead."""
    hidden = torch.randn(3, 16) * 30
    with torch.no_grad():
        exact = gpt.logits(hidden)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = gpt.logits(hidden)
            bf16_linear = gpt.lm_head(hidden)[:, :37]  # what autocast would have computed
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, exact)
    assert (bf16_linear.float() - exact).abs().max() > 1e-3
