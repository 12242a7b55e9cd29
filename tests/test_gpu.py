"""On a CUDA GPU: what only a GPU can show (skipped without one; run with `pytest -m gpu`).

The CPU suite tests every property; these run the same code where the device matters:
a CUDA sampling generator next to CPU shuffling, bf16 autocast with frozen models held in
bf16, float16 with loss scaling, the KV cache in the compute dtype, LoRA, all three scripts.
"""
import copy

import pytest
import torch

import train_ppo
import train_rm
import train_sft
from conftest import left_pad
from test_scripts import ppo_cfg, rm_cfg, sft_cfg

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_stages(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    train_sft.main(sft_cfg(root / "sft", device="cuda"))
    train_rm.main(rm_cfg(root / "rm", root / "sft", device="cuda"))
    return root


@pytest.mark.parametrize("critic,dtype,lora", [("shared", "auto", 0), ("separate", "auto", 0),
                                               ("separate", "float16", 0), ("shared", "auto", 4)])
def test_ppo_runs_on_cuda(cuda_stages, tmp_path, critic, dtype, lora):
    """Two iterations and an eval: the first update used to stop at randperm with a CUDA
    generator ("Expected a 'cpu' device type for generator")."""
    root = cuda_stages
    summary = train_ppo.main(ppo_cfg(tmp_path, root / "sft", root / "rm", device="cuda",
                                     dtype=dtype, critic=critic, lora_rank=lora, max_iters=2))
    assert summary["final"] and 0 <= summary["well_formed"] <= 1


def test_frozen_bf16_copy_equals_autocast_on_cuda():
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.runtime import hold_frozen_in
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=64)).cuda().eval()
    frozen = hold_frozen_in(copy.deepcopy(model).requires_grad_(False), torch.bfloat16)
    ids, mask = left_pad([[3, 4, 5, 6, 7], [8, 9]])
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = model(ids.cuda(), mask.cuda()), frozen(ids.cuda(), mask.cuda())
        assert a.dtype == torch.float32  # the output layer runs in float32
        assert model.new_kv_cache(2, 8).kv.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_float16_step_is_scaled_on_cuda():
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.optim import Optimizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=1, n_head=2, n_embd=64)).cuda()
    opt = Optimizer([{"params": list(model.parameters()), "lr": 1e-3, "weight_decay": 0.0}],
                    torch.float16, torch.device("cuda"))
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randint(0, 50, (4, 16), device="cuda")).float().logsumexp(-1).mean()
    opt.backward(loss)
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
