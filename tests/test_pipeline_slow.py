"""The full built-in pipeline at default options (~10 min on 2 cores): run with `pytest -m slow`.

It checks the quality targets only; how long each stage takes is measured by
bench/pipeline.py, never asserted in a test (shared machines are noisy).
"""
import pytest

import train_ppo
import train_rm
import train_sft


@pytest.mark.slow
def test_default_pipeline_raises_the_gold_reward(tmp_path):
    sft = train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft")))
    assert sft["well_formed"] >= 0.95 and abs(sft["gold"]) < 0.3, sft
    rm = train_rm.main(train_rm.Config(out_dir=str(tmp_path / "rm"), sft_dir=str(tmp_path / "sft")))
    assert rm["eval_gold_acc"] >= 0.90, rm
    ppo = train_ppo.main(train_ppo.Config(out_dir=str(tmp_path / "ppo"), sft_dir=str(tmp_path / "sft"),
                                          rm_dir=str(tmp_path / "rm")))
    assert ppo["gold"] >= 0.8 and ppo["well_formed"] >= 0.95, ppo


@pytest.mark.slow
def test_grpo_finds_binary_search_in_the_guessing_game(tmp_path):
    """docs/multiturn.md's commands (~5 min on 2 cores): from the weak teacher's SFT policy,
    GRPO wins at least 95 % of the held-out games, in at most 15 % more guesses than binary
    search's 3.27 on average."""
    from mingpt_rlhf.methods.env_guess import optimal_turns
    sft = train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft"), env="guess", max_new_tokens=3))
    assert sft["turns"] > 3.8, sft  # the teacher's habits: 4.08 guesses on average
    grpo = train_ppo.main(train_ppo.Config(out_dir=str(tmp_path / "grpo"), sft_dir=str(tmp_path / "sft"),
                                           env="guess", algo="grpo", max_new_tokens=3, max_iters=400))
    assert grpo["success"] >= 0.95 and grpo["turns"] <= 1.15 * optimal_turns(), grpo
