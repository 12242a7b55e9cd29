"""bench/vs_peers.py's GRPO parts, our side (trl's side needs its own venv, bench/peers/trl1/):
the shared checkpoint cannot end a response early, our command with the equal settings runs a
step of exactly the workload, and docs/speed.md quotes that command."""
import json
import os

import torch

from conftest import bench_module
from mingpt_rlhf.machinery.bpe import BPETokenizer
from mingpt_rlhf.model import GPT
from test_docs import commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_fixture(folder) -> str:
    """A grpo fixture at a test's size: 1 layer x 32, a BPE of 256 + 200 + 1 ids."""
    return bench_module("vs_peers").write_grpo_fixture(str(folder), n_layer=1, n_head=2, n_embd=32,
                                                       n_merges=200, n_prompts=40)


def test_the_grpo_checkpoints_eos_is_never_sampled_and_its_prompts_are_64_tokens(tmp_path):
    """Both sides load this checkpoint; ours samples GPT-2's EOS id unless its logit is far
    below the rest, and then a response would end early (less work than trl's)."""
    folder = tiny_fixture(tmp_path)
    tok = BPETokenizer.from_pretrained(folder)
    model = GPT.from_pretrained(folder, vocab_size=tok.vocab_size)
    ids = torch.randint(0, tok.eos_id, (4, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)
    logits = logits[0] if isinstance(logits, tuple) else logits
    others = torch.cat([logits[..., :tok.eos_id], logits[..., tok.eos_id + 1:tok.vocab_size]], -1)
    assert logits[..., tok.eos_id].max() < -20, logits[..., tok.eos_id].max()
    assert others.abs().max() < 5, others.abs().max()
    with open(os.path.join(folder, "prompts.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    assert len(prompts) == 40 and {len(tok.encode(p)) for p in prompts} == {64}


def test_our_side_runs_one_step_of_the_workload_with_the_equal_settings(tmp_path):
    vs_peers = bench_module("vs_peers")
    threads = torch.get_num_threads()
    try:
        result = vs_peers.ours_grpo(1, "tiny", "float32", warmup=0, iters=1,
                                    fixture=tiny_fixture(tmp_path / "fixture"))
    finally:
        torch.set_num_threads(threads)
    assert result["resp_len_all"] == [32.0]  # 32 new tokens in every response
    assert result["dtype"] == "float32"
    assert result["sec_per_iter"] > 0 and result["peak_rss_mb_steps"] > 0
    argv = result["argv"]
    for flag, value in zip(vs_peers.GRPO_EQUAL[::2], vs_peers.GRPO_EQUAL[1::2]):
        assert argv[argv.index(flag) + 1] == value


def test_speed_md_quotes_our_command_with_the_equal_settings():
    vs_peers = bench_module("vs_peers")
    found = [args for args in commands(os.path.join(ROOT, "docs", "speed.md"))
             if args[0] == "train_ppo.py" and "--kl_in" in args]
    assert len(found) == 1, found
    quoted = dict(zip(found[0][1::2], found[0][2::2]))  # every option here takes a value
    wanted = vs_peers.GRPO_FLAGS + vs_peers.GRPO_EQUAL + ["--dtype", "float32"]
    assert quoted.items() >= dict(zip(wanted[::2], wanted[1::2])).items()


def test_the_qwen3_fixture_is_a_family_folder_whose_eos_is_never_sampled(tmp_path):
    """grpo_qwen3's folder at a test's size: both sides read it as Qwen3 (config.json, the
    Hugging Face names); in ours EOS's logit lies far below every other token's (one constant
    coordinate of the residual stream, as RMSNorm has no bias to aim at), PAD is a row no
    token uses, and one step of the workload runs with every response at 32 tokens."""
    vs_peers = bench_module("vs_peers")
    shape = vs_peers.QWEN3_TINY
    folder = vs_peers.write_qwen3_fixture(str(tmp_path / "qwen3"), shape, n_prompts=40)
    tok = BPETokenizer.from_pretrained(folder)
    model = GPT.from_pretrained(folder, vocab_size=tok.vocab_size)
    assert model.config.qk_norm and model.config.embedding_rows == shape["vocab"]
    assert tok.eos_id == shape["tokens"] - 1 and tok.pad_id == shape["tokens"] < shape["vocab"]
    ids = torch.randint(0, tok.eos_id, (4, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)
    assert torch.log_softmax(logits, -1)[..., tok.eos_id].max() < -30
    with open(os.path.join(folder, "prompts.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    assert len(prompts) == 40 and {len(tok.encode(p)) for p in prompts} == {64}
    threads = torch.get_num_threads()
    try:
        result = vs_peers.ours_grpo(1, "qwen3_tiny", "float32", warmup=0, iters=1, fixture=folder)
    finally:
        torch.set_num_threads(threads)
    assert result["resp_len_all"] == [32.0]
    argv = result["argv"]
    assert argv[argv.index("--rollout_batch_size") + 1] == str(vs_peers.GRPO["prompts"] * 4)
