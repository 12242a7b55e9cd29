"""The shared optimizer step: float16 steps that the loss scaler skips are counted."""
import torch

from mingpt_rlhf.optim import Optimizer


def test_float16_overflow_steps_are_counted_and_survive_a_resume():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.ones(3))
    opt = Optimizer([{"params": [w], "lr": 0.1, "weight_decay": 0.0}], torch.float16,
                    torch.device("cpu"))
    for loss_scale, skipped in [(1e36, 1), (1.0, 1), (float("inf"), 2)]:
        before = w.detach().clone()
        opt.backward((w * loss_scale).sum())  # 1e36 x 65536 overflows float32: inf gradient
        opt.step()
        assert opt.skipped == skipped
        assert torch.equal(w.detach(), before) == (skipped > 0 and loss_scale != 1.0)
    again = Optimizer([{"params": [w], "lr": 0.1, "weight_decay": 0.0}], torch.float16,
                      torch.device("cpu"))
    again.load_state_dict(opt.state_dict())
    assert again.skipped == 2


def test_bfloat16_and_float32_count_only_what_the_caller_skips():
    w = torch.nn.Parameter(torch.ones(3))
    opt = Optimizer([{"params": [w], "lr": 0.1, "weight_decay": 0.0}], torch.bfloat16,
                    torch.device("cpu"))
    opt.backward(w.sum())
    opt.step()
    opt.backward((w * float("nan")).sum())
    opt.skip()  # a non-finite loss: the caller drops the step
    assert opt.skipped == 1 and w.grad is None
