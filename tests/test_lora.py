"""LoRA (machinery/lora.py): a zero update at the start, merging, what trains, the reference it gives."""
import copy

import pytest
import torch

from conftest import left_pad
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.heads import RewardModel
from mingpt_rlhf.machinery.lora import (LoRALinear, adapters_disabled, add_lora, merged_state_dict,
                                        parse_targets, trainable_state_dict)
from mingpt_rlhf.model import GPT, GPTConfig

CFG = GPTConfig(vocab_size=19, block_size=32, n_layer=2, n_head=2, n_embd=32)


def model_with_lora(rank=4, alpha=8.0, seed=0):
    torch.manual_seed(seed)
    base = GPT(CFG).eval()
    adapted = copy.deepcopy(base)
    add_lora(adapted, rank, alpha)
    return base, adapted


def randomise_adapters(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(std=0.1)


def test_zero_initialised_adapters_leave_logits_unchanged():
    base, adapted = model_with_lora()
    idx = torch.randint(0, 19, (2, 9))
    assert torch.equal(base(idx), adapted(idx))
    n_layers = sum(isinstance(m, LoRALinear) for m in adapted.modules())
    assert n_layers == 4 * CFG.n_layer  # c_attn, attn.c_proj, c_fc, mlp.c_proj in every block


def test_merged_weights_equal_the_adapted_model_and_keep_gpt2_names():
    base, adapted = model_with_lora()
    randomise_adapters(adapted)
    merged = GPT(CFG).eval()
    state = merged_state_dict(adapted)
    assert set(state) == set(base.state_dict())  # no lora_ entries, GPT-2 names
    merged.load_state_dict(state)
    idx = torch.randint(0, 19, (2, 9))
    torch.testing.assert_close(merged(idx), adapted(idx), atol=1e-5, rtol=0)
    assert not torch.allclose(base(idx), adapted(idx), atol=1e-3)


def test_only_adapter_parameters_receive_gradients():
    _, adapted = model_with_lora()
    adapted.train()
    adapted(torch.randint(0, 19, (2, 9))).logsumexp(-1).sum().backward()
    for name, p in adapted.named_parameters():
        if "lora_" in name:
            assert p.requires_grad and p.grad is not None, name
        else:
            assert not p.requires_grad and p.grad is None, name
    assert all(k.endswith(("lora_A", "lora_B")) for k in trainable_state_dict(adapted))


def test_adapters_disabled_equals_a_frozen_copy_of_the_base():
    """PPO with LoRA uses the actor with adapters off as its reference: it must compute exactly
    what a frozen copy of the starting model computes, however far the adapters moved."""
    base, adapted = model_with_lora()
    randomise_adapters(adapted)
    ids, mask = left_pad([[3, 4, 5, 6], [7, 8]])
    with adapters_disabled(adapted):
        off = adapted(ids, mask)
    torch.testing.assert_close(off, base(ids, mask), atol=0, rtol=0)
    assert not torch.allclose(adapted(ids, mask), off, atol=1e-3)  # switched back on after


def test_a_head_added_after_lora_trains_in_full():
    torch.manual_seed(0)
    rm = RewardModel(CFG)
    add_lora(rm.gpt, 2, 4.0)
    trained = trainable_state_dict(rm)
    assert {"head.weight", "head.bias"} <= set(trained)
    assert all(k.startswith("head.") or "lora_" in k for k in trained)


def test_unknown_target_is_a_user_error():
    with pytest.raises(UserError, match="lora_targets"):
        add_lora(GPT(CFG), 2, 4.0, targets=("c_attn", "q_proj"))


def test_base_checksum_is_the_same_whatever_dtype_holds_the_base():
    """A LoRA run saves a checksum of its frozen base; --resume compares it with the rebuilt
    one. The base is then held in float32, or (hold_frozen_in, under bf16 / fp16 autocast) in
    low precision: the same base must pass in each, and a changed base (even one row's sign
    flipped) must not."""
    from mingpt_rlhf.stages import load_resume_state, resume_state
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    _, adapted = model_with_lora()
    saved = resume_state(hold_frozen_in(copy.deepcopy(adapted), torch.bfloat16))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        load_resume_state(hold_frozen_in(model_with_lora()[1], dtype), saved, "ckpt.pt")
    for change in (lambda w: w.add_(0.01), lambda w: w[0].neg_()):
        base, _ = model_with_lora()
        with torch.no_grad():
            change(base.transformer.h[0].attn.c_attn.weight)
        add_lora(base, 4, 8.0)
        with pytest.raises(UserError, match="base weights differ"):
            load_resume_state(hold_frozen_in(base, torch.bfloat16), saved, "ckpt.pt")


def test_merged_weights_are_built_on_the_cpu_and_only_by_rank_0(monkeypatch):
    """Checkpoints hold merged weights; under torchrun only rank 0 writes, so the others build
    nothing (on 8 GPUs, 8 float32 copies of every adapted weight for one file)."""
    from mingpt_rlhf import stages
    from mingpt_rlhf.machinery import distributed
    _, adapted = model_with_lora()
    assert all(t.device.type == "cpu" for t in stages.weights_for_later_stages(adapted).values())
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(stages, "merged_state_dict", lambda m: pytest.fail("merged on rank 1"))
    assert stages.weights_for_later_stages(adapted) == {}


def test_the_output_layer_is_refused_as_a_target(tmp_path, capsys):
    """GPT.logits reads lm_head's weight directly: an adapter there would never act (and alone,
    GRPO would fail with no gradient at all). Refused with one line, exit 2."""
    import conftest
    with pytest.raises(UserError, match="lora_targets lm_head"):
        parse_targets("c_attn,lm_head")
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), "--lora_rank",
                                                  "4", "--lora_targets", "lm_head"])
    assert "--lora_targets lm_head" in line and "never act" in line, line
