import os

import pytest
import torch

from mingpt_rlhf.model import GPT, GPTConfig

# the training scripts draw their curves at the end when matplotlib is installed; the tests run
# them dozens of times, so only tests/test_plot.py draws (it turns this back on)
os.environ["MINGPT_RLHF_PLOT"] = "0"


@pytest.fixture
def tiny_gpt():
    """A random 2-layer GPT in eval mode (dropout off), fp32, seeded."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=64, n_layer=2, n_head=2, n_embd=32))
    return model.eval()


def left_pad(rows, pad_id=0):
    """List of token lists -> (ids, mask), left-padded to the longest row."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, T - len(r):] = torch.tensor(r)
            mask[i, T - len(r):] = 1
    return ids, mask


@pytest.fixture(scope="session")
def stages(tmp_path_factory):
    """A tiny SFT run and the RM trained from it, shared read-only by the script tests:
    (root folder holding sft/ and rm/, SFT summary, RM summary)."""
    import train_rm
    import train_sft
    from test_scripts import rm_cfg, sft_cfg
    root = tmp_path_factory.mktemp("pipeline")
    sft = train_sft.main(sft_cfg(root / "sft"))
    rm = train_rm.main(rm_cfg(root / "rm", root / "sft"))
    return root, sft, rm
