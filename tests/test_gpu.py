"""On a CUDA GPU: every script where the device matters (skipped without one; `pytest -m gpu`).

The CPU suite proves every property, and tests/test_matrix.py runs every path in bf16 on the
CPU. These run the same paths on the device, with its default dtype (bf16 where supported):
a CUDA sampling generator next to CPU shuffling, frozen models held in bf16, the KV cache in
the compute dtype, LoRA merges built on the CPU, float16 with loss scaling, GPT-2's 50,257-id
vocabulary, a checkpoint moved between the GPU and the CPU, and nccl when 2 GPUs are visible.

Every run: finite figures, no skipped step, KL 0 at the start (to float32 rounding) and approx-KL < 1e-3 on
the first minibatch of every update, a killed run resumes to the uninterrupted one's weights,
and a checkpoint reloads to the logits the run computed.

MINGPT_RLHF_GPU_TESTS_ON=cpu runs this module on the CPU instead (a dry run of the tests'
own logic where no GPU is lent; the CUDA-only checks are then skipped).
"""
import copy
import os

import pytest
import torch

import train_dpo
import train_ppo
import train_rm
import train_sft
from conftest import left_pad
from test_matrix import (check_run, dpo_cfg, gpt2_vocab_pipeline,  # noqa: F401
                         rl_cfg, rm_cfg, sft_cfg, straight_and_resumed)

DEVICE = os.environ.get("MINGPT_RLHF_GPU_TESTS_ON", "cuda")
ON_CUDA = DEVICE == "cuda"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="a CUDA-only check")
LORA = dict(lora_rank=4, lora_alpha=8.0)


@pytest.fixture(scope="module")
def cuda_stages(tmp_path_factory):
    """SFT and RM with LoRA in the device's default dtype, each killed and resumed."""
    root = tmp_path_factory.mktemp("cuda")
    with pytest.MonkeyPatch.context() as mp:
        sft, _ = straight_and_resumed(mp, train_sft, lambda out, **kw: sft_cfg(
            out, device=DEVICE, dtype="auto", grad_accum=2, **LORA, **kw), root / "sft")
        check_run(root / "sft" / "killed", sft)
        rm, _ = straight_and_resumed(mp, train_rm, lambda out, **kw: rm_cfg(
            out, root / "sft" / "killed", device=DEVICE, dtype="auto", **LORA, **kw), root / "rm")
        check_run(root / "rm" / "killed", rm)
    return root / "sft" / "killed", root / "rm" / "killed"


def reloads_to_the_same_logits(ckpt_dir, lora: bool):
    """The policy in a checkpoint gives the same float32 logits on the GPU as on the CPU; a
    LoRA run's merged weights were built on the CPU (not a GPU copy per process)."""
    from mingpt_rlhf.model import GPT, GPTConfig
    ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=False)  # devices as saved
    adapted = [k for k in ckpt["model"] if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    if lora:
        assert adapted and all(ckpt["model"][k].device.type == "cpu" for k in adapted)
    model = GPT(GPTConfig(**ckpt["model_config"])).eval()
    model.load_state_dict({k: v.cpu() for k, v in ckpt["model"].items()})
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10]])
    with torch.no_grad():
        on_cpu = model(ids, mask)
        on_device = model.to(DEVICE)(ids.to(DEVICE), mask.to(DEVICE)).cpu()
    torch.testing.assert_close(on_device, on_cpu, rtol=0, atol=1e-4)


def test_sft_and_rm_on_the_device(cuda_stages):
    reloads_to_the_same_logits(cuda_stages[0], lora=True)


@pytest.mark.parametrize("lora", [4, 0], ids=["lora", "full"])
def test_dpo_on_the_device(cuda_stages, tmp_path, monkeypatch, lora):
    sft, _ = cuda_stages
    summary, _ = straight_and_resumed(monkeypatch, train_dpo, lambda out, **kw: dpo_cfg(
        out, sft, device=DEVICE, dtype="auto", lora_rank=lora, lora_alpha=8.0, **kw), tmp_path)
    check_run(tmp_path / "killed", summary)
    reloads_to_the_same_logits(tmp_path / "killed", lora=bool(lora))


@pytest.mark.parametrize("algo,lora,dtype,extra", [
    ("ppo", 4, "auto", dict(critic="separate", grad_checkpoint=True)),
    ("ppo", 0, "auto", dict(critic="shared")),
    ("grpo", 4, "auto", dict(group_size=4, kl_in="loss")),
    ("rloo", 0, "auto", dict(group_size=4)),
], ids=["ppo-separate-lora", "ppo-shared", "grpo-lora", "rloo"])
def test_rl_methods_on_the_device(cuda_stages, tmp_path, monkeypatch, first_minibatch_kl, algo,
                                  lora, dtype, extra):
    sft, rm = cuda_stages
    summary, _ = straight_and_resumed(monkeypatch, train_ppo, lambda out, **kw: rl_cfg(
        out, sft, rm, device=DEVICE, algo=algo, dtype=dtype, lora_rank=lora, lora_alpha=8.0,
        **extra, **kw), tmp_path)
    check_run(tmp_path / "killed", summary, rl=True)
    assert first_minibatch_kl and max(first_minibatch_kl) < 1e-3, first_minibatch_kl
    reloads_to_the_same_logits(tmp_path / "killed", lora=bool(lora))


def test_float16_counts_the_scalers_first_skipped_steps(cuda_stages, tmp_path):
    """float16 with loss scaling: the scaler may skip the first steps at its initial scale,
    and skipped_updates counts exactly those: each skip halves the scale (65,536 at first),
    which doubles again only after 2,000 clean steps."""
    sft, rm = cuda_stages
    summary = train_ppo.main(rl_cfg(tmp_path, sft, rm, device=DEVICE, dtype="float16",
                                    critic="separate", max_iters=3))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    skipped = 0
    for opt in (ckpt["actor_opt"], ckpt["critic_opt"]):
        assert opt["scaler"]["scale"] == 65536.0 / 2 ** opt["skipped"]
        skipped += opt["skipped"]
    assert summary["final"] and summary["skipped_updates"] == skipped


def test_gpt2_vocabulary_on_the_device(tmp_path, first_minibatch_kl):
    _, _, ppo = gpt2_vocab_pipeline(tmp_path, first_minibatch_kl, device=DEVICE, dtype="auto")


@needs_cuda
def test_a_gpu_checkpoint_resumes_on_the_cpu_with_a_note(cuda_stages, tmp_path, monkeypatch, capsys):
    """Its CUDA random streams cannot be restored on a CPU: reseeded, with a one-line note."""
    from test_scripts import Killed, kill_after_first_save
    sft, rm = cuda_stages
    with monkeypatch.context() as m:
        kill_after_first_save(m, train_ppo)
        with pytest.raises(Killed):
            train_ppo.main(rl_cfg(tmp_path, sft, rm, device="cuda"))
    capsys.readouterr()
    summary = train_ppo.main(rl_cfg(tmp_path, sft, rm, device="cpu", resume=True))
    assert summary["final"] and "written on another kind of device" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_processes_on_two_gpus_with_nccl(cuda_stages, tmp_path):
    """torchrun with nccl: the ranks stay in step (the same weights after every update) and
    the first minibatch's ratio is 1 (to rounding) on both."""
    import json
    from test_distributed import options, torchrun
    sft, rm = cuda_stages
    torchrun("ppo_probe", tmp_path, "train_ppo", *options(
        out_dir=tmp_path / "ppo", sft_dir=sft, rm_dir=rm, device="cuda", max_iters=2,
        rollout_batch_size=8, minibatch_size=4, ppo_epochs=2, eval_interval=2, eval_prompts=8,
        max_new_tokens=8))
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert all(r["first_minibatch"]["approx_kl"] < 1e-3 for r in ranks)
    a, b = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_cuda
def test_frozen_bf16_copy_equals_autocast_on_cuda():
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=64)).cuda().eval()
    frozen = hold_frozen_in(copy.deepcopy(model).requires_grad_(False), torch.bfloat16)
    ids, mask = left_pad([[3, 4, 5, 6, 7], [8, 9]])
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = model(ids.cuda(), mask.cuda()), frozen(ids.cuda(), mask.cuda())
        assert a.dtype == torch.float32  # the output layer runs in float32
        assert model.new_kv_cache(2, 8).kv.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_cuda
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
