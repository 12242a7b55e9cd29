"""bench/gpu_once.py, the script a lent GPU runs: its FLOP count by hand, and a dry run on the CPU."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_once  # noqa: E402


def test_model_flops_by_hand():
    """GPT-2 small at the recipe's batch: 12 layers x 768, 256 + 64 tokens, 16 rows (SFT) or
    16 pairs = 32 sequences (RM)."""
    per_token = 6 * 12 * 12 * 768 * 768 + 12 * 12 * 768 * 320  # blocks' weights + attention
    assert gpu_once.model_flops("rm", "small", "recipe") == per_token * 32 * 320
    # SFT adds the output layer at the 64 response tokens of each of its 16 rows
    assert gpu_once.model_flops("sft", "small", "recipe") == (
        per_token * 16 * 320 + 6 * 50257 * 768 * 16 * 64)
    assert gpu_once.row_name("ppo", "small", "recipe", {"algo": "grpo", "lora_rank": 16}) \
        == "grpo_lora_recipe"
    assert gpu_once.row_name("sft", "medium", "recipe", {}) == "medium_sft_full_recipe"


def test_utilisation_only_where_six_flops_per_weight_hold():
    card = {"peak_bf16_tflops": 100.0}
    row = {"stage": "rm", "shape": "small", "batch": "recipe", "seconds": 0.5}
    gpu_once.add_utilisation(row, card)
    flops = gpu_once.model_flops("rm", "small", "recipe")
    assert row["mfu"] == round(flops / 0.5 / 1e12 / 100.0, 3)
    lora = {"stage": "rm", "shape": "small", "batch": "recipe", "seconds": 0.5, "lora_rank": 16}
    gpu_once.add_utilisation(lora, card)
    assert "mfu" not in lora


@pytest.mark.slow
def test_the_timing_part_runs_on_the_cpu(tmp_path):
    """The dry run a session does before spending a GPU's minutes: every row, no error."""
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_once.py"), "--device", "cpu",
                    "--tiny", "--part", "timing", "--out", str(tmp_path / "out"),
                    "--work", str(tmp_path / "work")], check=True, cwd=ROOT, capture_output=True)
    result = json.load(open(tmp_path / "out" / "gpu_timing.json"))
    rows = result["gpt2"]
    assert set(rows) == {f"{m}_{w}_cpu" for m in ("sft", "rm", "ppo", "grpo") for w in ("full", "lora")}
    assert all("error" not in r and r["seconds"] > 0 for r in rows.values())
    assert all(r["finite"] for name, r in rows.items() if name.startswith(("ppo", "grpo")))
    assert set(result["decoding"]["tiny"]) == {"actor_b4", "actor_b16", "frozen_b4", "frozen_b16"}
