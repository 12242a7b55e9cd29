"""bench/gpu_once.py, the script a lent GPU runs: its FLOP count by hand and against the model's
own weights, and a dry run of its parts on the CPU at tiny size (the first three parts and the
pipeline's worker in this process; the whole script, its subprocesses too, under -m slow)."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_once  # noqa: E402


def test_model_flops_by_hand():
    """GPT-2 small at the recipe's batch: 12 layers x 768, 256 + 64 tokens, 16 rows (SFT) or
    16 pairs = 32 sequences (RM). Qwen3-0.6B at the fuller batch (64 rows, 32 pairs): per
    layer queries and output 2 x 1,024 x (16 x 128), keys and values 2 x 1,024 x (8 x 128),
    SwiGLU 3 x 1,024 x 3,072; the attention over 16 heads of 128; 151,669 ids."""
    per_token = 6 * 12 * 12 * 768 * 768 + 12 * 12 * 768 * 320  # blocks' weights + attention
    assert gpu_once.model_flops("rm", "small", "recipe") == per_token * 32 * 320
    # SFT adds the output layer at the 64 response tokens of each of its 16 rows
    assert gpu_once.model_flops("sft", "small", "recipe") == (
        per_token * 16 * 320 + 6 * 50257 * 768 * 16 * 64)
    layer = 2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072
    assert layer * 28 == 440_401_920  # Qwen3-0.6B's 0.44 B weights outside the embedding
    per_token = 6 * 28 * layer + 12 * 28 * 16 * 128 * 320
    assert gpu_once.model_flops("rm", "qwen3", "gpu") == per_token * 64 * 320
    assert gpu_once.model_flops("sft", "qwen3", "gpu") == (
        per_token * 64 * 320 + 6 * 151669 * 1024 * 64 * 64)
    assert gpu_once.row_name("ppo", "", "recipe", {"algo": "grpo", "lora_rank": 16}) \
        == "grpo_lora_recipe"
    assert gpu_once.row_name("sft", "", "gpu", {"tf32_output_layer": True}) == "sft_full_gpu_tf32"


@pytest.mark.parametrize("shape", ["small", "qwen3"])
def test_the_formulas_weights_are_the_models(shape):
    """block_weights counts the matrices our GPT builds for that shape (on the meta device:
    no memory): GPT-2's, and Qwen3's grouped heads, head width and SwiGLU."""
    from mingpt_rlhf.model import GPT, GPTConfig
    m = gpu_once.shape_of(shape)
    config = GPTConfig(vocab_size=m["vocab"], block_size=64, n_layer=m["L"], n_head=m["heads"],
                       n_embd=m["C"])
    if shape == "qwen3":
        config = GPTConfig(vocab_size=m["vocab"], block_size=64, n_layer=m["L"], n_head=m["heads"],
                           n_embd=m["C"], n_kv_head=m["kv_heads"], head_dim=m["head_dim"],
                           mlp_hidden=m["hidden"], rope_theta=1e6, rms_norm_eps=1e-6,
                           qk_norm=True, bias=False)
    with torch.device("meta"):
        model = GPT(config)
    counted = sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2)
    assert counted == gpu_once.block_weights(m)


def test_utilisation_only_where_six_flops_per_weight_hold():
    card = {"peak_bf16_tflops": 100.0}
    row = {"stage": "rm", "shape": "small", "batch": "recipe", "seconds": 0.5}
    gpu_once.add_utilisation(row, card)
    flops = gpu_once.model_flops("rm", "small", "recipe")
    assert row["mfu"] == round(flops / 0.5 / 1e12 / 100.0, 3)
    lora = {"stage": "rm", "shape": "small", "batch": "recipe", "seconds": 0.5, "lora_rank": 16}
    gpu_once.add_utilisation(lora, card)
    assert "mfu" not in lora


def test_a_busy_moment_cannot_make_a_decoding_step_negative():
    """The dry run once measured a negative step on a loaded machine: one timed run of each
    kind, and the one-token run was the one slowed. The fastest of five of each is not fooled
    by a slowed run of either kind (seconds of a tiny model's runs: 4 ms a prompt pass, 0.7 ms
    a step of the 10)."""
    ones = [0.031, 0.004, 0.0046, 0.0041, 0.0052]  # the first run met a busy moment
    alls = [0.0105, 0.0118, 0.029, 0.0104, 0.0111]  # and the third of these
    one, whole = gpu_once.fastest(ones, alls)
    assert (one, whole) == (0.004, 0.0104)
    assert (whole - one) / 9 > 0 > alls[0] - ones[0]  # the single pair gives a negative step


def check_parts(out, names):
    """What a dry run's JSONs must hold: every row measured, none failed."""
    parts = {n: json.load(open(out / f"gpu_{n}.json")) for n in names}
    if "decode" in parts:
        rows = parts["decode"]["rows"]
        assert set(rows) == {f"{m}_b{b}" for m in ("eager", "fixed", "graph") for b in (4, 8)}
        assert all(r["ms_per_step"] > 0 and r["x_bound_measured_copy"] > 0 for r in rows.values())
        assert rows["graph_b4"]["captures"] == [] and not rows["graph_b4"]["graphs"]  # a CPU
        assert set(parts["decode"]["profile"]) == {"eager", "graph"}
    if "iterations" in parts:
        rows = parts["iterations"]["rows"]
        assert set(rows) == {f"{a}_{w}_tiny" for a in ("ppo", "grpo") for w in ("full", "lora")}
        assert all("error" not in r and r["seconds"] > 0 and r["finite"] for r in rows.values()), rows
        assert parts["iterations"]["shape"]["mlp"] == "swiglu"
    if "mfu" in parts:
        rows = parts["mfu"]["rows"]
        assert rows["sft_full_tiny_tf32"] == {"skipped": "CUDA only"}
        for name in ("sft_full_tiny", "rm_full_tiny", "sft_profile"):
            assert "error" not in rows[name] and rows[name]["seconds"] > 0, rows[name]
            assert rows[name]["model_tflop_per_step"] >= 0
        assert rows["sft_profile"]["profile"]["steps"] == 2
    if "tests" in parts:
        assert parts["tests"]["rc"] == 0, parts["tests"]
    if "pipeline" in parts:
        p = parts["pipeline"]
        assert p["rc"] == 0 and all(p[s]["final"]["final"] for s in ("sft", "rm", "ppo")), p
        assert p["ppo"]["decode_captures"] is None  # no graphs on a CPU


def test_the_dry_run_of_the_first_parts(tmp_path):
    """Parts 1-3 at tiny size, in this process, as the script runs them; the pipeline's
    worker too (its process is the slow test's)."""
    args = argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"),
                              device="cpu", tiny=True, budget=600, revision="test")
    os.makedirs(args.out)
    run = gpu_once.Run(args)
    for part in ("decode", "iterations", "mfu"):
        getattr(gpu_once, part)(run)
    check_parts(tmp_path / "out", ["decode", "iterations", "mfu"])
    result = gpu_once.pipeline_worker({"root": str(tmp_path / "pipeline"), "device": "cpu",
                                       "options": gpu_once.PIPELINE_TINY})
    assert all(result[s]["final"]["final"] for s in ("sft", "rm", "ppo"))


@pytest.mark.slow
def test_the_whole_dry_run_on_the_cpu(tmp_path):
    """The dry run a session does before spending a GPU's minutes: every part, in order."""
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_once.py"), "--device", "cpu",
                    "--tiny", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                   check=True, cwd=ROOT, capture_output=True)
    check_parts(tmp_path / "out", gpu_once.PARTS)
