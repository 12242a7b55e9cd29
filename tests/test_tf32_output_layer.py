"""runtime.output_layer_in_tf32 (--tf32_output_layer): TF32 in the output layer's products only,
forward and backward, the process-wide switch as it was around them."""
import pytest
import torch

from conftest import exits_2
from mingpt_rlhf.logprobs import lm_logprobs
from mingpt_rlhf.machinery import runtime
from mingpt_rlhf.decode_graphs import what_a_graph_reads
from mingpt_rlhf.model import GPT, GPTConfig


def tiny(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=32))


def in_tf32(model):
    runtime.output_layer_in_tf32(model)  # on a CPU the switch changes no product
    return model


def switch():
    return runtime.cuda_matmul_switch()[2]


def test_the_same_layer_its_products_alone_in_tf32(monkeypatch):
    """The same logits and gradients as GPT.logits; each of the three products runs with
    CUDA's float32 matmuls switched to TF32, everything else, before and after, with the
    process's own setting."""
    plain, tf32 = tiny(), in_tf32(tiny())
    name, on, before = runtime.cuda_matmul_switch()
    assert before != on  # torch's default: so TF32 below can only come from the layer
    seen = []
    real_linear, real_matmul = torch.nn.functional.linear, torch.Tensor.__matmul__
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: (
        seen.append(switch()), real_linear(*a, **k))[1])
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: (
        seen.append(switch()), real_matmul(a, b))[1])
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    for model in (plain, tf32):
        seen.clear()
        hidden = model.trunk(ids)
        logprobs, _ = lm_logprobs(model, hidden[:, :-1], ids[:, 1:], temperature=0.7)
        logprobs.sum().backward()
        assert switch() == before
        if model is tf32:
            assert seen.count(on) == 3, seen  # forward, and the backward's two products
    torch.testing.assert_close(tf32(ids), plain(ids), rtol=0, atol=1e-6)
    for (name, a), b in zip(plain.named_parameters(), tf32.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-6, msg=name)


def test_a_scripts_own_switch_of_either_form_is_left_as_it_was():
    """torch 2.9+ refuses to read the legacy form of its TF32 switch once the new one is set
    to something else: the layer reads and sets the new form, which reads right after either.
    A script that set either form keeps its value and can read it back."""
    model = in_tf32(tiny())
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("a torch before 2.9 has the legacy form only")
    for form in ("legacy", "new"):
        if form == "legacy":
            torch.set_float32_matmul_precision("high")
        else:
            torch.backends.cuda.matmul.fp32_precision = "tf32"  # all TF32, said the new way
        try:
            model(torch.tensor([[1, 2, 3]])).sum().backward()
            if form == "legacy":
                assert torch.get_float32_matmul_precision() == "high"
            else:
                assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        finally:
            torch.set_float32_matmul_precision("highest")
            torch.backends.cuda.matmul.fp32_precision = "none"
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_decode_graph_notices_the_layer_changed():
    model = tiny()
    reads = what_a_graph_reads(model)
    in_tf32(model)
    assert what_a_graph_reads(model) != reads


@pytest.mark.parametrize("script", ["train_sft", "train_ppo"])
def test_refused_off_cuda(capsys, tmp_path, script):
    """Before any model is read (the PPO run's --sft_dir does not even exist)."""
    extra = ["--sft_dir", str(tmp_path / "none")] if script == "train_ppo" else []
    line = exits_2(capsys, script, ["--tf32_output_layer", "--device", "cpu", "--out_dir",
                                    str(tmp_path / "out"), *extra])
    assert "--tf32_output_layer is for CUDA GPUs" in line, line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tf32_log_probs_within_a_hundredth_of_a_nat_on_cuda():
    """At GPT-2's width and vocabulary (random weights of GPT-2's spread), TF32 log-probs
    stay within 0.01 nats of float32's (bench/tf32_logprobs.py's emulation: 0.003), the
    backward too, and the switch is back where it was."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50257, block_size=64, n_layer=1, n_head=12, n_embd=768)).cuda()
    with torch.no_grad():
        model.lm_head.weight.normal_(std=0.14)
    hidden = torch.nn.functional.layer_norm(torch.randn(256, 768, device="cuda"), (768,))
    hidden.requires_grad_(True)
    tokens = torch.randint(50257, (256,), device="cuda")
    exact, _ = lm_logprobs(model, hidden, tokens)
    grad_exact = torch.autograd.grad(exact.sum(), hidden)[0]
    before = switch()
    runtime.output_layer_in_tf32(model)
    fast, _ = lm_logprobs(model, hidden, tokens)
    grad_fast = torch.autograd.grad(fast.sum(), hidden)[0]
    assert switch() == before
    assert (fast - exact).abs().max() < 0.01
    assert (fast - exact).abs().max() > 0  # TF32 did act (float32 would be bit for bit)
    torch.testing.assert_close(grad_fast, grad_exact, rtol=0.02, atol=1e-3)
