"""Padding-free passes (machinery/packing.py): the real tokens of a padded batch packed into few rows
get the hidden states, values and gradients they get in the padded batch."""
import pytest
import torch

from mingpt_rlhf.machinery import packing
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.machinery.packing import Packing


def padded_batch(seed=0):
    """Left-padded prompts, responses ending at different columns, right padding after them."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 14
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, (start, end) in enumerate([(4, 9), (0, 14), (6, 8), (5, 12), (3, 6), (7, 10)]):
        mask[b, start:end] = 1
    ids = torch.randint(1, 30, (B, T), generator=g) * mask  # PAD = 0
    return ids, mask


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=30, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()


def unpacked(fn, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(packing, "MIN_SAVING", 2.0)  # never pays: the padded path
        return fn()


def test_the_packing_holds_every_real_token_once_in_fewer_positions():
    ids, mask = padded_batch()
    p = Packing.of(mask)
    assert p is not None and p.rows * p.width <= 0.75 * mask.numel()
    assert len(p.real) == len(p.slot) == int(mask.sum()) and len(set(p.slot.tolist())) == len(p.slot)
    torch.testing.assert_close(p.unpack(p.pack(ids)), ids)  # back where each token was
    assert Packing.of(torch.ones(4, 9)) is None  # no padding: nothing to pack


def test_packed_hidden_states_and_gradients_equal_the_padded_ones(model, monkeypatch):
    ids, mask = padded_batch()
    real = mask.bool()
    packed = model.trunk(ids, mask)
    padded = unpacked(lambda: model.trunk(ids, mask), monkeypatch)
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=0)
    assert (packed[~real] == 0).all()  # padding: zeros, not values nobody reads
    weights = torch.randn_like(packed)

    def grads(fn):
        model.zero_grad()
        (fn()[real] * weights[real]).sum().backward()
        return [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads(lambda: model.trunk(ids, mask)),
                    grads(lambda: unpacked(lambda: model.trunk(ids, mask), monkeypatch))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_sequences_packed_in_one_row_do_not_see_each_other(model):
    ids, mask = padded_batch()
    p = Packing.of(mask)
    T = ids.size(1)
    line_of = {b: set((p.slot[p.real // T == b] // p.width).tolist()) for b in range(len(ids))}
    neighbours = [b for b in range(len(ids)) if b != 2 and line_of[b] == line_of[2]]
    assert neighbours  # sequence 2 shares its packed row
    before = model.trunk(ids, mask)
    changed = ids.clone()
    changed[2, 6:8] = (changed[2, 6:8] % 29) + 1  # only sequence 2's tokens change
    after = model.trunk(changed, mask)
    others = [b for b in range(len(ids)) if b != 2]
    torch.testing.assert_close(after[others], before[others], atol=1e-6, rtol=0)
    assert not torch.allclose(after[2, 6:8], before[2, 6:8])


@pytest.mark.slow  # compiling takes 10-60 s on a small CPU
def test_compiled_blocks_compute_what_the_eager_ones_compute(model, monkeypatch):
    ids, mask = padded_batch()
    eager = model.trunk(ids, mask)
    model.compile_blocks()
    torch.testing.assert_close(model.trunk(ids, mask), eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.trunk(ids[:, :9]), unpacked(lambda: model.trunk(ids[:, :9]), monkeypatch),
                               atol=1e-5, rtol=0)


def test_a_float_mask_and_shared_position_ids_take_the_packed_path_too(model):
    """The trunk accepted a float mask and (1, T) position ids before packing existed; the
    packed path takes them too, and computes what the int mask and (B, T) ids compute."""
    ids, mask = padded_batch()
    B, T = ids.shape
    real = mask.bool()
    reference = model.trunk(ids, mask)
    torch.testing.assert_close(model.trunk(ids, mask.float())[real], reference[real])
    shared = torch.arange(T)[None]  # (1, T)
    torch.testing.assert_close(model.trunk(ids, mask, shared)[real],
                               model.trunk(ids, mask, shared.expand(B, T))[real])
