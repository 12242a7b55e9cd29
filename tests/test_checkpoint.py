"""Random state in checkpoints across machines: one GPU's state, and a move between CPU and CUDA.

A CPU-only machine cannot run CUDA, so these stand in for one: torch.cuda's RNG functions are
replaced by fakes that record what they are asked (tests/test_gpu.py runs the real ones)."""
import pytest
import torch

from mingpt_rlhf import checkpoint


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
