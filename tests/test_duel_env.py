"""The two-player example game (examples/duel_env.py): its rules, that perfect play wins every
held-out opening and the teacher about half, that its demonstrations are SFT data, and a tiny
SFT -> GRPO run on it through the scripts, as a user would run them."""
import pytest

from conftest import example_game, sft_then_rl_on_a_game
from mingpt_rlhf.data import Transcript, load_sft_jsonl
from mingpt_rlhf.methods.episodes import HELD_OUT_SEEDS, load_env

duel, SPEC = example_game("duel_env.py", "Duel")   # SPEC: what a user passes to --env
Duel = duel.Duel


def test_the_scripts_load_the_game_from_its_file():
    env_class, _ = load_env(SPEC)
    assert env_class().reset(5) == Duel().reset(5)


def test_the_rules_by_hand():
    env = Duel()
    opening = env.reset(0)
    pile = int(opening.split()[0])
    assert pile in duel.PILES and env.pile == pile
    reply, reward, done = env.step("one")
    assert reward == 0.0 and not done
    words = reply.split()
    assert words[:2] == ["i", "take"] and words[2] in ("one", "two")
    assert int(words[-2]) == pile - 1 - duel.WORDS[words[2]] == env.pile
    # the last stone wins: take it
    env.pile = 2
    assert env.step("two") == ("you win", 1.0, True)
    # the opponent takes the last stone: a loss, reward 0
    env = Duel()
    env.reset(0)
    env.pile = 2
    assert env.step("one") == ("i take one : i win", 0.0, True)


@pytest.mark.parametrize("action", ["", " ", "three", "one two", "1", "One", "<eos>"])
def test_an_illegal_answer_ends_the_episode_with_reward_0(action):
    env = Duel()
    env.reset(3)
    assert env.step(action) == ("illegal , you lose", 0.0, True)


def test_taking_two_of_one_stone_is_illegal():
    env = Duel()
    env.reset(3)
    env.pile = 1
    assert env.step("two") == ("illegal , you lose", 0.0, True)
    assert duel.illegal_end([("env", "i take one : 1 left"), ("policy", "two")])
    assert not duel.illegal_end([("env", "i take one : 2 left"), ("policy", "two")])


def perfect_wins_against_every_opponent(pile: int) -> bool:
    """Perfect play against every sequence of opponent moves (enumerated), not only the
    seeded random one: True if it wins them all."""
    if pile == 0:
        return False                        # the opponent took the last stone
    pile -= duel.perfect_move(pile)
    if pile == 0:
        return True
    return all(perfect_wins_against_every_opponent(pile - k) for k in (1, 2) if k <= pile)


def test_perfect_play_wins_every_held_out_opening():
    assert all(perfect_wins_against_every_opponent(p) for p in duel.PILES)
    for seed in range(200):                 # the held-out openings an eval plays
        env = Duel()
        env.reset(seed)
        reward, done = 0.0, False
        while not done:
            _, reward, done = env.step(["one", "two"][duel.perfect_move(env.pile) - 1])
        assert reward == 1.0, seed
    # and every pile of the game occurs among them
    openings = {Duel().reset(s) for s in range(200)}
    assert {int(o.split()[0]) for o in openings} == set(duel.PILES)


def test_the_teacher_wins_about_half_and_below_perfect_play():
    assert duel.teacher_win() == pytest.approx(0.542, abs=1e-3)
    # the exact recursion against enumeration: every sequence of moves, each equally likely
    for pile in duel.PILES:
        def win(p, mine):
            moves = [k for k in (1, 2) if k <= p]
            return sum((1.0 if mine else 0.0) if k == p else win(p - k, not mine)
                       for k in moves) / len(moves)
        assert duel.teacher_win(pile) == pytest.approx(win(pile, True))
    # and its seeded episodes on the held-out openings agree with it (2000 seeds: +-0.03)
    wins = [play_transcript(s) for s in range(2000)]
    assert sum(wins) / len(wins) == pytest.approx(duel.teacher_win(), abs=0.035)


def play_transcript(seed: int) -> float:
    """The reward a teacher's episode earns, replayed through a fresh environment."""
    env = Duel()
    turns = duel.teacher_episode(seed)
    assert turns[0] == ("env", env.reset(seed))
    for role, text in turns[1:]:
        if role == "policy":
            reply, reward, done = env.step(text)
        else:
            assert text == reply and not done
    assert done
    return reward


def test_the_teachers_demonstrations_parse_as_sft_episodes(tmp_path):
    path = tmp_path / "demos.jsonl"
    duel.write_demonstrations(str(path), episodes=50)
    items = load_sft_jsonl(str(path))
    assert len(items) == 50 and all(isinstance(t, Transcript) for t in items)
    for t in items:
        assert t[0][0] == "env" and t[-1][0] == "policy"       # the verdict left out
        assert all(text in duel.WORDS for role, text in t if role == "policy")
        assert not duel.illegal_end(list(t))
    # demonstrations are drawn from training seeds: no held-out opening's episode
    assert duel.TRAINING_SEEDS_FROM == HELD_OUT_SEEDS


def test_sft_then_grpo_on_the_game_run_end_to_end(tmp_path):
    sft_then_rl_on_a_game(tmp_path, duel, SPEC, "grpo")
