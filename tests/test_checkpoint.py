"""Random state in checkpoints across machines: one GPU's state, and a move between CPU and CUDA.

A CPU-only machine cannot run CUDA, so these stand in for one: torch.cuda's RNG functions are
replaced by fakes that record what they are asked (tests/test_gpu.py runs the real ones)."""
import os

import pytest
import torch

from mingpt_rlhf import stages
from mingpt_rlhf.machinery import checkpoint


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine with 2 visible GPUs whose current device is 0; records set_rng_state calls."""
    calls = {"set": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.arange(16, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all",
                        lambda: [torch.arange(16, dtype=torch.uint8)] * 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": calls["set"].append(s))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                        lambda states: pytest.fail("every GPU's state: fails with fewer GPUs"))
    return calls


def test_a_checkpoint_holds_the_current_gpus_state_only(fake_cuda):
    state = checkpoint.rng_state()
    assert isinstance(state["cuda"], torch.Tensor)  # one state, not a list of every GPU's
    checkpoint.set_rng_state(state)
    assert len(fake_cuda["set"]) == 1


def test_an_earlier_checkpoint_with_every_gpus_state_resumes_on_one(fake_cuda):
    state = checkpoint.rng_state()
    state["cuda"] = [torch.full((16,), 7, dtype=torch.uint8)] * 8  # written on 8 GPUs
    checkpoint.set_rng_state(state)
    assert torch.equal(fake_cuda["set"][0], torch.full((16,), 7, dtype=torch.uint8))


def test_a_cuda_checkpoint_resumes_on_the_cpu_with_a_note(capsys):
    """Written on a GPU (a CUDA RNG state, a CUDA sampling generator), resumed on a CPU: the
    CUDA streams cannot be restored there. The run goes on, reseeded, and says so."""
    state = {"global": {**checkpoint.rng_state(), "cuda": torch.zeros(16, dtype=torch.uint8)},
             "sample": torch.zeros(16, dtype=torch.uint8),          # a CUDA generator's state
             "shuffle": torch.Generator().manual_seed(3).get_state(),
             "devices": {"sample": "cuda", "shuffle": "cpu"}}
    sample, shuffle = torch.Generator(), torch.Generator()
    checkpoint.restore_rank_rng({"rng": [state]}, "ckpt.pt", sample=sample, shuffle=shuffle)
    assert torch.equal(shuffle.get_state(), torch.Generator().manual_seed(3).get_state())
    assert "written on another kind of device" in capsys.readouterr().out
    # the reseed comes from the restored CPU stream: the same checkpoint, the same samples
    again = torch.Generator()
    checkpoint.restore_rank_rng({"rng": [state]}, "ckpt.pt", sample=again, shuffle=torch.Generator())
    assert torch.equal(sample.get_state(), again.get_state())


def test_generators_of_the_same_device_are_restored_exactly(capsys):
    sample = torch.Generator().manual_seed(5)
    torch.rand(3, generator=sample)
    saved = checkpoint.rank_rng_states(sample=sample)
    expected = torch.rand(4, generator=sample)
    restored = torch.Generator()
    checkpoint.restore_rank_rng({"rng": saved}, "ckpt.pt", sample=restored)
    assert torch.equal(torch.rand(4, generator=restored), expected)
    assert capsys.readouterr().out == ""


# ---- reading only what a later stage needs -------------------------------------------------
def memory_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))


def reset_peak_memory():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM, the peak resident set size, back to the current size


def write_sft_checkpoint(folder, optimizer_mb: int = 0):
    """An SFT checkpoint of a small GPT, with `optimizer_mb` of stand-in optimizer state."""
    from dataclasses import asdict

    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.tokenizer import WordTokenizer
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32))
    tok = WordTokenizer(["w%d" % i for i in range(36)])
    checkpoint.save_checkpoint(str(folder / "ckpt.pt"), {
        "stage": "sft", "model": model.state_dict(), "model_config": asdict(model.config),
        "tokenizer": tok.state_dict(), "step": 3,
        "optimizer": {"exp_avg": torch.ones(optimizer_mb * 2**18)}})
    return model


def test_a_later_stage_loads_the_weights_tied_and_exact(tmp_path):
    model = write_sft_checkpoint(tmp_path)
    ids = torch.randint(0, 40, (2, 9))
    for frozen in (False, True):
        policy, _, origin = stages.load_policy(str(tmp_path), frozen=frozen)
        assert policy.lm_head.weight is policy.transformer.wte.weight  # still one tied tensor
        assert torch.equal(policy(ids), model.eval()(ids)) and origin["step"] == 3
        assert all(p.requires_grad != frozen for p in policy.parameters())


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads Linux's /proc")
def test_the_optimizer_state_of_an_earlier_stage_is_never_read_into_memory(tmp_path):
    """An SFT checkpoint holds AdamW's moments beside the weights (at GPT-2 size 1 GB of its
    1.5 GB); a later stage needs the weights only. Loading the policy from a checkpoint with
    256 MB of optimizer state raises the process's peak memory by far less than that."""
    write_sft_checkpoint(tmp_path, optimizer_mb=256)
    reset_peak_memory()
    before = memory_mb("VmRSS")
    stages.load_policy(str(tmp_path))
    assert memory_mb("VmHWM") - before < 64
    # read whole (what --resume does with the run's own checkpoint), it is all in memory
    reset_peak_memory()
    before = memory_mb("VmRSS")
    whole = checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert memory_mb("VmHWM") - before > 200 and whole["optimizer"]["exp_avg"].sum() > 0
