"""The corridor example game (examples/corridor_env.py): its rules, that perfect play wins every
held-out episode and the teacher about a quarter, that its demonstrations are SFT data, and a
tiny SFT -> PPO run on it through the scripts, as a user would run them."""
import pytest

from conftest import example_game, sft_then_rl_on_a_game
from mingpt_rlhf.data import Transcript, load_sft_jsonl
from mingpt_rlhf.methods.episodes import HELD_OUT_SEEDS, load_env

corridor, SPEC = example_game("corridor_env.py", "Corridor")
Corridor = corridor.Corridor


def test_the_scripts_load_the_game_from_its_file():
    env_class, _ = load_env(SPEC)
    assert env_class().reset(5) == Corridor().reset(5)


def test_the_rules_by_hand():
    env = Corridor()
    env.reset(0)
    env.walker, env.door = 2, 0
    assert env.step("right") == ("you are at 3", 0.0, False)
    assert env.step("left") == ("you are at 2", 0.0, False)
    assert env.step("left") == ("you are at 1", 0.0, False)
    assert env.step("left") == ("you are out", 1.0, True)
    env.reset(0)
    env.walker, env.door = 8, 0   # the wall at 8 holds the walker
    assert env.step("right") == ("you are at 8", 0.0, False)
    for _ in range(4):
        env.step("right")
    assert env.step("right") == ("too late , you lose", 0.0, True)   # the sixth move


@pytest.mark.parametrize("action", ["", " ", "up", "left right", "Left", "<eos>"])
def test_an_illegal_answer_ends_the_episode_with_reward_0(action):
    env = Corridor()
    env.reset(3)
    assert env.step(action) == ("illegal , you lose", 0.0, True)


def test_perfect_play_wins_every_held_out_episode_and_the_teacher_a_quarter():
    for seed in range(200):
        env = Corridor()
        env.reset(seed)
        reward, done = 0.0, False
        while not done:
            _, reward, done = env.step("left" if env.door < env.walker else "right")
        assert reward == 1.0, seed
    assert {corridor.start_of(s)[1] for s in range(200)} == {0, corridor.CELLS - 1}
    assert corridor.teacher_win() == pytest.approx(0.2552, abs=1e-4)
    wins = []
    for seed in range(3000):
        env = Corridor()
        turns = corridor.teacher_episode(seed)
        assert turns[0] == ("env", env.reset(seed))
        for role, text in turns[1:]:
            if role == "policy":
                reply, reward, done = env.step(text)
            else:
                assert text == reply and not done
        wins.append(reward)
    assert sum(wins) / len(wins) == pytest.approx(corridor.teacher_win(), abs=0.03)


def test_the_teachers_demonstrations_parse_as_sft_episodes(tmp_path):
    path = tmp_path / "demos.jsonl"
    corridor.write_demonstrations(str(path), episodes=50)
    items = load_sft_jsonl(str(path))
    assert len(items) == 50 and all(isinstance(t, Transcript) for t in items)
    for t in items:
        assert t[0][0] == "env" and t[-1][0] == "policy"
        assert all(text in corridor.WORDS for role, text in t if role == "policy")
    assert corridor.TRAINING_SEEDS_FROM == HELD_OUT_SEEDS


def test_sft_then_ppo_on_the_game_run_end_to_end(tmp_path):
    rows = sft_then_rl_on_a_game(tmp_path, corridor, SPEC, "ppo")
    assert [r["stuck"] for r in rows if "pg_loss" in r] == [0, 0]   # logged every iteration
