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


def test_vocabulary_rows_are_padded_but_never_returned():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16))
    assert model.transformer.wte.weight.shape[0] == 64 == model.config.padded_vocab_size
    assert model(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)
    assert GPTConfig(vocab_size=50257).padded_vocab_size == 50304  # GPT-2's, as in nanoGPT


def test_a_state_dict_from_before_the_padding_still_loads(tiny_gpt):
    from mingpt_rlhf.model import load_state_dict_checked
    old = dict(tiny_gpt.state_dict())
    old["transformer.wte.weight"] = old["transformer.wte.weight"][:17].clone()  # unpadded
    fresh = GPT(tiny_gpt.config).eval()
    load_state_dict_checked(fresh, old, "old checkpoint")
    idx = torch.randint(0, 17, (2, 6))
    torch.testing.assert_close(fresh(idx), tiny_gpt(idx), rtol=0, atol=0)


def test_grad_checkpoint_gives_the_same_loss_and_gradients(tiny_gpt):
    idx = torch.randint(0, 17, (3, 12))
    grads = []
    for recompute in [False, True]:
        tiny_gpt.zero_grad()
        tiny_gpt.grad_checkpoint = recompute
        loss = tiny_gpt(idx).logsumexp(-1).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in tiny_gpt.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_kv_cache_is_in_the_autocast_dtype(tiny_gpt):
    assert tiny_gpt.new_kv_cache(2, 8).kv.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tiny_gpt.new_kv_cache(2, 8).kv.dtype == torch.bfloat16


def test_a_frozen_copy_held_in_bf16_computes_what_autocast_computes(tiny_gpt):
    """hold_frozen_in stores the Linear weights as autocast would cast them: the same logits,
    to the last bit, under bf16 autocast (so the KL of the reference to the actor starts at
    0), with the embedding (and so the output layer) kept in float32."""
    import copy
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    frozen = hold_frozen_in(copy.deepcopy(tiny_gpt).requires_grad_(False), torch.bfloat16)
    assert frozen.transformer.h[0].attn.c_attn.weight.dtype == torch.bfloat16
    assert frozen.transformer.wte.weight.dtype == torch.float32
    assert frozen.transformer.h[0].ln_1.weight.dtype == torch.float32
    ids, mask = left_pad([[3, 4, 5, 6, 7], [8, 9]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(frozen(ids, mask), tiny_gpt(ids, mask), rtol=0, atol=0)
