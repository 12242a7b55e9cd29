"""Properties of the GPT: causality, KV cache == full forward, padding invariance, names."""
import torch

from conftest import left_pad
from mingpt_rlhf.model import GPT, GPTConfig


def test_gpt2_parameter_names_and_tied_head(tiny_gpt):
    names = {n for n, _ in tiny_gpt.named_parameters()}
    for n in ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
              "transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias",
              "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight",
              "transformer.ln_f.bias"]:
        assert n in names, n
    assert tiny_gpt.lm_head.weight is tiny_gpt.transformer.wte.weight


def test_causality(tiny_gpt):
    idx = torch.randint(0, 17, (2, 12))
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 3) % 17
    a, b = tiny_gpt(idx), tiny_gpt(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_kv_cache_equals_full_forward(tiny_gpt):
    idx = torch.randint(0, 17, (3, 20))
    full = tiny_gpt(idx)
    cache = tiny_gpt.new_kv_cache(3, 20)
    steps = [tiny_gpt(idx[:, :8], kv_cache=cache)]  # a prefill of 8, then 3, then one at a time
    steps.append(tiny_gpt(idx[:, 8:11], kv_cache=cache))
    for t in range(11, 20):
        steps.append(tiny_gpt(idx[:, t:t + 1], kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


def test_left_padding_invariance(tiny_gpt):
    rows = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    ids, mask = left_pad(rows)
    batched = tiny_gpt(ids, mask)
    for i, r in enumerate(rows):
        alone = tiny_gpt(torch.tensor([r]))
        torch.testing.assert_close(batched[i, -len(r):], alone[0], rtol=0, atol=1e-5)


def test_left_padding_with_cache(tiny_gpt):
    rows = [[3, 4, 5, 6, 7], [9, 10]]
    ids, mask = left_pad(rows)
    ext = torch.tensor([[14], [15]])
    cache = tiny_gpt.new_kv_cache(2, 6)
    tiny_gpt(ids, mask, kv_cache=cache)
    step = tiny_gpt(ext, torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
                    position_ids=mask.sum(-1, keepdim=True), kv_cache=cache)
    for i, r in enumerate(rows):
        alone = tiny_gpt(torch.tensor([r + [ext[i, 0].item()]]))
        torch.testing.assert_close(step[i, -1], alone[0, -1], rtol=0, atol=1e-5)


def test_hidden_states_and_too_long():
    model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=8))
    logits, hidden = model(torch.zeros(2, 4, dtype=torch.long), return_hidden=True)
    assert logits.shape == (2, 4, 5) and hidden.shape == (2, 4, 8)
    try:
        model(torch.zeros(1, 5, dtype=torch.long))
    except ValueError as e:
        assert "block_size" in str(e)
    else:
        raise AssertionError("a sequence longer than block_size must be refused")


def test_weight_decay_groups_hold_matrices_only(tiny_gpt):
    decay, no_decay = tiny_gpt.optim_groups(0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(tiny_gpt.parameters()))
