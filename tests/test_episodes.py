"""Episodes with an environment: the sampler (methods/episodes.py), GAE over the holes, the mask in
every loss, SFT on transcripts, the built-in guessing game, and the --env paths of the scripts."""
import json
import os

import numpy as np
import pytest
import torch

import sample
import train_ppo
import train_sft
import conftest
from conftest import as_options


def exits_2(capsys, script, argv):
    return conftest.exits_2(capsys, script, [str(x) for x in argv])
from test_scripts import assert_same_weights, killed_after_first_save, read_metrics
from mingpt_rlhf import ppo_trainer
from mingpt_rlhf.methods import episodes
from mingpt_rlhf.data import IGNORE, SFTData, Transcript, encode_transcript, load_sft_jsonl
from mingpt_rlhf.methods.env_guess import (GuessNumber, optimal_turns, parse_guess, teacher_episode,
                                           teacher_success, teacher_turns, where_in_interval)
from mingpt_rlhf.methods.episodes import HELD_OUT_SEEDS, EpisodeSource, play_episodes
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.logprobs import sequence_logprobs
from mingpt_rlhf.losses import GROUP_ALGOS
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.ppo import FixedKLController, gae
from mingpt_rlhf.tokenizer import WordTokenizer


def tiny_policy(tokenizer, block_size=64, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=2,
                         n_head=2, n_embd=32)).eval()


def env_cfg(out_dir, sft_dir, **kw):
    """A tiny RL run on the guessing game: 4 iterations of 16 episodes."""
    base = dict(out_dir=str(out_dir), sft_dir=str(sft_dir), env="guess", max_iters=4,
                rollout_batch_size=16, minibatch_size=8, ppo_epochs=2, eval_interval=2,
                eval_prompts=8, max_new_tokens=3, max_turns=6)
    if kw.get("algo", "ppo") in GROUP_ALGOS:  # ppo reads no --group_size
        base["group_size"] = 4
    return train_ppo.Config(**{**base, **kw})


# ----------------------------------------------------------------------------- GAE, holes
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8)])
def test_gae_over_holes_equals_gae_with_the_holes_cut_out(gamma, lam):
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 12), torch.randn(3, 12)
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0],    # two holes, then padding
                         [1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1],    # a hole after the first action
                         [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]]).float()  # none: one turn
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for b in range(3):
        kept = mask[b].bool()
        ref_adv, ref_ret = gae(rewards[b, kept][None], values[b, kept][None],
                               torch.ones(1, int(kept.sum())), gamma, lam)
        torch.testing.assert_close(adv[b, kept], ref_adv[0])
        torch.testing.assert_close(ret[b, kept], ref_ret[0])
        assert (adv[b, ~kept] == 0).all() and (ret[b, ~kept] == 0).all()


def test_gae_bootstraps_a_turns_last_action_from_the_next_turns_first():
    """By hand: actions at columns 0 and 3, the environment at 1 and 2; gamma 1, lambda 1.
    The first action's advantage is r0 + V3 - V0 + (r3 - V3) = r0 + r3 - V0."""
    rewards = torch.tensor([[0.5, 9.0, 9.0, 2.0]])
    values = torch.tensor([[1.0, 7.0, 7.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv, _ = gae(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5 + 2.0 - 1.0, 0.0, 0.0, 2.0 - 3.0]]))


# ----------------------------------------------------------------------------- the sampler
def test_stored_logprobs_equal_a_fresh_forward_over_the_whole_episode():
    """Continuing from the KV cache across turns (padding between them, positions counted per
    row) gives the log-probs, entropies and hidden states a fresh pass over the compacted
    episode gives, to float32 rounding."""
    tok = GuessNumber.tokenizer()
    model = tiny_policy(tok)
    ep = play_episodes(model, tok, GuessNumber, list(range(12)), max_turns=5, max_new_tokens=3,
                       generator=torch.Generator().manual_seed(0), score=True)
    T = ep.prompt_len
    acted = ep.action_mask[:, T:].bool()
    assert (ep.turns > 1).any() and (acted.sum(-1) < ep.attention_mask[:, T:].sum(-1)).any()
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, ep.sequences, ep.attention_mask, T,
                                    suppress=tok.pad_id, entropy="value")
        hidden = model.trunk(ep.sequences, ep.attention_mask)[:, T - 1:-1]
    assert (lp - ep.logprobs)[acted].abs().max() < 1e-5
    assert (ent - ep.entropy)[acted].abs().max() < 1e-5
    assert (hidden - ep.hidden)[acted].abs().max() < 1e-4
    assert (ep.logprobs[~acted] == 0).all()


class AliasTokenizer(WordTokenizer):
    """Two ids write "a": encode("a") gives the first; the second decodes to "a" as well. A
    history decoded and encoded again would turn the second into the first."""

    def __init__(self):
        super().__init__(["start", "a", "ok"])
        self.itos.append("a")  # id 6
        self.alias = len(self.itos) - 1


class SaysOk:
    """Three turns; reward 1 each time the policy says "a"."""

    def reset(self, seed):
        self.turn = 0
        return "start"

    def step(self, action):
        self.turn += 1
        return "ok", float(action == "a"), self.turn == 3


def test_the_ids_trained_on_are_the_ids_sampled(monkeypatch):
    tok = AliasTokenizer()
    calls = []

    def scripted(logits, *args, **kwargs):  # every turn: the alias of "a", then EOS
        calls.append(len(logits))
        token = tok.alias if len(calls) % 2 else tok.eos_id
        return torch.full((len(logits),), token, dtype=torch.long)
    monkeypatch.setattr(episodes, "sample_next", scripted)
    ep = play_episodes(tiny_policy(tok), tok, SaysOk, [0, 1], max_turns=5, max_new_tokens=4)
    start, ok, eos, alias = tok.stoi["start"], tok.stoi["ok"], tok.eos_id, tok.alias
    expected = [start, alias, eos, ok, alias, eos, ok, alias, eos]
    assert ep.sequences.tolist() == [expected, expected]
    assert ep.action_mask[0].tolist() == [0, 1, 1, 0, 1, 1, 0, 1, 1]
    assert ep.transcripts[0][1] == ("policy", "a") and ep.returns.tolist() == [3.0, 3.0]
    # each turn's reward sits on its last action (the EOS), nowhere else
    assert ep.rewards[0].tolist() == [0, 1, 0, 0, 1, 0, 0, 1]


class EndsAtSeed:
    """Episode `seed` ends after `seed` turns; counts its step calls."""
    steps = {}

    def reset(self, seed):
        self.seed, self.turn = seed, 0
        return "guess a number from 1 to 15 :"

    def step(self, action):
        self.turn += 1
        EndsAtSeed.steps[self.seed] = EndsAtSeed.steps.get(self.seed, 0) + 1
        return "higher", 0.0, self.turn == self.seed


def test_a_finished_episode_generates_nothing_more():
    tok = GuessNumber.tokenizer()
    model = tiny_policy(tok)
    rows = []
    real_trunk = model.trunk
    model.trunk = lambda idx, *a, **k: (rows.append(len(idx)), real_trunk(idx, *a, **k))[1]
    EndsAtSeed.steps = {}
    ep = play_episodes(model, tok, EndsAtSeed, [1, 3, 2], max_turns=8, max_new_tokens=2,
                       generator=torch.Generator().manual_seed(0))
    assert EndsAtSeed.steps == {1: 1, 3: 3, 2: 2}      # step is never called after done
    assert ep.turns.tolist() == [1, 3, 2] and ep.ended_by == ["env"] * 3
    assert rows[0] == 3 and rows == sorted(rows, reverse=True) and rows[-1] == 1
    # the first episode holds its opening and one turn: nothing after it
    assert int(ep.attention_mask[0].sum()) == 8 + int(ep.action_mask[0].sum())  # 8: the opening


def test_an_episode_ends_at_the_turn_budget_and_at_the_context():
    tok = GuessNumber.tokenizer()
    ep = play_episodes(tiny_policy(tok), tok, EndsAtSeed, [50], max_turns=3, max_new_tokens=2,
                       generator=torch.Generator().manual_seed(0))
    assert ep.ended_by == ["turns"] and ep.turns.tolist() == [3] and not ep.done.any()
    # a context of 16: the 8-token opening, then turns of up to 2 tokens and 1-token replies
    ep = play_episodes(tiny_policy(tok, block_size=16), tok, EndsAtSeed, [50], max_turns=20,
                       max_new_tokens=2, generator=torch.Generator().manual_seed(0))
    assert ep.ended_by == ["context"] and int(ep.attention_mask.sum()) <= 16


# ----------------------------------------------------------------------------- the mask
def trainer_on_episodes(algo, mask_env=True, seed=0):
    tok = GuessNumber.tokenizer()
    # another reference than the actor: the KL (in the reward) gives every episode a different
    # return, so the groups have advantages even while every random episode loses
    actor, ref = tiny_policy(tok, seed=seed), tiny_policy(tok, seed=seed + 1)
    for p in ref.parameters():
        p.requires_grad_(False)
    cfg = train_ppo.Config(algo=algo, group_size=4, max_new_tokens=3, minibatch_size=8,
                           ppo_epochs=1, entropy_coef=0.01, kl_in="reward",
                           critic="shared", target_kl=0, ptx_coef=0, actor_lr=1e-3)
    head = None
    if algo == "ppo":
        from mingpt_rlhf.heads import ScalarHead
        head = ScalarHead(actor.config.n_embd)
    source = EpisodeSource(GuessNumber, "guess", tok, max_turns=5, mask_env=mask_env)
    trainer = ppo_trainer.PPOTrainer(cfg, actor, ref, None, value_head=head, eos_id=tok.eos_id,
                                     pad_id=tok.pad_id, kl_ctl=FixedKLController(0.1),
                                     episodes=source)
    return trainer


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_environment_tokens_get_no_gradient_no_kl_and_no_value_target(algo, monkeypatch):
    """Through a real update: the gradient of the whole loss (policy, entropy, KL, value) with
    respect to the log-prob, entropy and value of every environment token is exactly 0. Left
    unmasked (`mask_env` False), the same tokens do get a gradient: the check can fail."""
    for mask_env in (True, False):
        trainer = trainer_on_episodes(algo, mask_env)
        exp, stats, ep = trainer.play([1_000_000 + i // 4 for i in range(8)],
                                      torch.Generator().manual_seed(0))
        T = ep.prompt_len
        env_tokens = (ep.attention_mask[:, T:] == 1) & (ep.action_mask[:, T:] == 0)
        assert env_tokens.any()
        if mask_env:
            for name in ("logprobs", "ref_logprobs", "values", "rewards", "advantages", "returns"):
                assert (getattr(exp, name)[env_tokens] == 0).all(), name
            # the KL per episode is the sum over the policy's tokens only
            with torch.no_grad():
                lp, _ = sequence_logprobs(trainer.actor, ep.sequences, ep.attention_mask, T,
                                          suppress=0)
                ref, _ = sequence_logprobs(trainer.ref, ep.sequences, ep.attention_mask, T,
                                           suppress=0)
            kl = ((lp - ref) * ep.action_mask[:, T:]).sum(-1).mean().item()
            assert abs(stats["kl"] - kl) < 1e-5
        grads = {}
        real = ppo_trainer.lm_logprobs

        def spy(*args, **kwargs):
            lp, ent = real(*args, **kwargs)
            if lp.requires_grad:
                lp.register_hook(lambda g: grads.__setitem__("logprobs", g))
                if ent is not None and ent.requires_grad:
                    ent.register_hook(lambda g: grads.__setitem__("entropy", g))
            return lp, ent
        monkeypatch.setattr(ppo_trainer, "lm_logprobs", spy)
        if algo == "ppo":
            real_head = trainer.value_head.forward

            def head(hidden):
                v = real_head(hidden)
                if v.requires_grad:
                    v.register_hook(lambda g: grads.__setitem__("values", g.squeeze(-1)))
                return v
            monkeypatch.setattr(trainer.value_head, "forward", head)
        trainer.buffer.add(exp)
        trainer.learn(torch.Generator().manual_seed(0))
        monkeypatch.undo()
        # the minibatch holds all 8 rows (in shuffled order): compare by row content
        touched = {k: (g != 0) for k, g in grads.items()}
        assert set(grads) == ({"logprobs", "entropy", "values"} if algo == "ppo"
                              else {"logprobs", "entropy"})
        order = _rows_of_minibatch(exp, trainer)
        for k, nonzero in touched.items():
            n = nonzero.size(1)
            on_env = nonzero & env_tokens[order][:, :n]
            if mask_env:
                assert not on_env.any(), k
                assert nonzero.any(), k  # the policy's own tokens do learn
            elif k == "logprobs":
                assert on_env.any()  # unmasked: the environment's tokens are trained on


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_an_episodes_score_is_its_return_the_sum_of_its_turns_rewards(algo):
    """GRPO and RLOO learn from one number per episode: its return, every turn's reward
    summed (the game's -0.1 per wrong guess and its final reward), minus beta x the KL over
    the policy's tokens, baselined by its group. Episodes of several rewarded turns are
    played, so the last turn's reward alone would give other scores and advantages."""
    from mingpt_rlhf.methods.critic_free import group_advantages, leave_one_out_advantages
    trainer = trainer_on_episodes(algo)
    exp, stats, ep = trainer.play([1_000_000 + i // 4 for i in range(8)],
                                  torch.Generator().manual_seed(0))
    returns = ep.rewards.sum(-1)
    last_turn = ep.rewards.gather(1, ep.rewards.ne(0).long().cumsum(-1).argmax(-1, keepdim=True))[:, 0]
    assert ((returns - last_turn).abs() > 0.05).any()  # the two readings differ on this batch
    torch.testing.assert_close(exp.scores, returns, atol=1e-6, rtol=0)
    assert stats["score"] == pytest.approx(returns.mean().item(), abs=1e-6)
    T = ep.prompt_len
    kl = ((exp.logprobs - exp.ref_logprobs) * ep.action_mask[:, T:]).sum(-1)
    reward = returns - 0.1 * kl
    baseline = leave_one_out_advantages if algo == "rloo" else \
        (lambda r, k: group_advantages(r, k, normalise_std=False))
    m = exp.action_mask
    torch.testing.assert_close(exp.advantages, baseline(reward, 4)[:, None] * m, atol=1e-5, rtol=0)


def test_dr_grpos_budget_on_episodes_is_every_turns_tokens():
    """Dr. GRPO sums each response's token losses and divides by the generation budget, a
    constant: for an episode, every turn's, max_turns (5) x max_new_tokens (3) = 15, which no
    episode's actions can pass. On the first minibatch (ratio 1) the policy loss is then
    mean_i(-A_i x n_i) / 15 for episodes of n_i actions; one turn's budget (3) gives 5 times it."""
    trainer = trainer_on_episodes("grpo")
    assert trainer.spec.reduction == "budget" and trainer.budget == 15
    exp, _, _ = trainer.play([1_000_000 + i // 4 for i in range(8)], torch.Generator().manual_seed(0))
    n = exp.action_mask.sum(-1)
    assert n.max() <= 15 and n.max() > 3  # episodes of more than one turn
    A = exp.advantages.sum(-1) / n                                        # (B,) one per episode
    want = (-A * n).mean().item() / 15
    assert abs(want) > 1e-3
    trainer.buffer.add(exp)
    stats = trainer.learn(torch.Generator().manual_seed(0))
    assert stats["minibatch_steps"] == 1
    assert stats["pg_loss"] == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_unmasked_environment_tokens_get_the_learners_logprobs_not_the_samplers():
    """With --mask_env false the environment's tokens count as actions, but the sampler never
    drew them and has no log-prob for them: the stored old log-probs of every token, the
    replies' included, are a full forward pass's (nonzero), so the first minibatch's ratio is
    1 on all of them (approx-KL 0 to rounding), as with the mask."""
    trainer = trainer_on_episodes("grpo", mask_env=False)
    assert trainer.sampler_scores  # float32, no lag: the sampler's log-probs would be reused
    exp, _, ep = trainer.play([1_000_000 + i // 4 for i in range(8)], torch.Generator().manual_seed(0))
    T = ep.prompt_len
    env_tokens = (ep.attention_mask[:, T:] == 1) & (ep.action_mask[:, T:] == 0)
    assert env_tokens.any() and torch.equal(exp.action_mask.bool(), ep.attention_mask[:, T:].bool())
    with torch.no_grad():
        lp, _ = sequence_logprobs(trainer.actor, ep.sequences, ep.attention_mask, T, suppress=0)
    torch.testing.assert_close(exp.logprobs, lp * exp.action_mask, atol=1e-5, rtol=0)
    assert (exp.logprobs[env_tokens] < -1e-3).all()
    trainer.buffer.add(exp)
    assert abs(trainer.learn(torch.Generator().manual_seed(0))["approx_kl"]) < 1e-6


def _rows_of_minibatch(exp, trainer):
    """The order of the rows of the (single, shuffled) minibatch of `learn`, recovered by
    drawing the permutation again with the same generator."""
    return torch.randperm(len(exp.scores), generator=torch.Generator().manual_seed(0))


def test_the_first_minibatch_of_every_update_on_episodes_has_ratio_one(guess_sft, tmp_path,
                                                                        first_minibatch_kl):
    """The stored log-probs of the actions are the learner's: approx-KL 0 to rounding."""
    for algo in ("ppo", "grpo"):
        train_ppo.main(env_cfg(tmp_path / algo, guess_sft, algo=algo))
    assert len(first_minibatch_kl) == 8
    assert max(abs(k) for k in first_minibatch_kl) < 1e-6


# ----------------------------------------------------------------------------- SFT
def test_sft_on_a_transcript_puts_no_loss_on_the_environments_turns():
    tok = GuessNumber.tokenizer()
    turns = Transcript(teacher_episode(5))
    data = SFTData(tok, [turns, ("guess a number from 1 to 15 :", "8")], block_size=64)
    inputs, targets = data.batch([0, 1])
    policy = [i for role, text in turns if role == "policy" for i in tok.encode(text) + [tok.eos_id]]
    assert [t for t in targets[0].tolist() if t != IGNORE] == policy
    # position t predicts token t + 1: a target exactly where that token is the policy's
    ids, acted = encode_transcript(tok, turns)
    assert len(ids) - 1 <= targets.size(1)
    assert [targets[0, t].item() != IGNORE for t in range(len(ids) - 1)] == [bool(a) for a in acted[1:]]
    # a (prompt, response) pair in the same batch still trains on its response only
    assert [t for t in targets[1].tolist() if t != IGNORE] == [tok.stoi["8"], tok.eos_id]


def test_episode_lines_of_a_jsonl_file_load_as_transcripts(tmp_path, capsys):
    good = tmp_path / "episodes.jsonl"
    good.write_text(json.dumps({"turns": [{"role": "env", "text": "guess a number from 1 to 15 :"},
                                          {"role": "policy", "text": "8"}]}) + "\n"
                    + json.dumps({"prompt": "guess a number from 1 to 15 :", "response": "3"}) + "\n")
    items = load_sft_jsonl(str(good))
    assert isinstance(items[0], Transcript) and items[0][1] == ("policy", "8")
    assert items[1] == ("guess a number from 1 to 15 :", "3")
    for line, words in [({"turns": [{"role": "user", "text": "x"}]}, ":1: turn 1 must be"),
                        ({"turns": [{"role": "policy", "text": "8"}]}, "starts with the environment"),
                        ({"turns": [{"role": "env", "text": "hi"}]}, "no policy turn"),
                        ({"turns": "8"}, "expected")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(line) + "\n")
        assert words in exits_2(capsys, "train_sft", ["--data", bad, "--out_dir", tmp_path / "s"])


# ----------------------------------------------------------------------------- the game
def test_the_guessing_game_and_its_known_figures():
    env = GuessNumber()
    assert env.reset(3) == "guess a number from 1 to 15 :"
    secret = env.secret
    assert env.reset(3) and env.secret == secret  # the seed decides the secret
    assert len({GuessNumber().reset(s) or 0 for s in range(3)}) == 1
    guesses, lo, hi = [], 1, 15
    while True:  # binary search always wins within 4 guesses
        guess = (lo + hi) // 2
        guesses.append(guess)
        reply, reward, done = env.step(str(guess))
        if done:
            break
        assert reward == -GuessNumber.COST
        lo, hi = (guess + 1, hi) if reply == "higher" else (lo, guess - 1)
    assert reward == 1.0 and len(guesses) <= 4
    assert optimal_turns() == pytest.approx(49 / 15)
    assert teacher_turns(1) == 1 and teacher_turns(2) == 1.5 and teacher_success(1, 1) == 1
    assert teacher_turns() == pytest.approx(4.0789, abs=1e-4)
    assert teacher_success() == pytest.approx(0.9162, abs=1e-4)
    # the teacher's demonstrations are legal: every guess inside the interval still possible
    for seed in range(50):
        lo, hi, t = 1, 15, teacher_episode(seed)
        for (role, text), (_, reply) in zip(t, t[1:] + [("env", "")]):
            if role == "policy":
                assert lo <= int(text) <= hi
                lo, hi = ((int(text) + 1, hi) if reply == "higher" else
                          (lo, int(text) - 1) if reply == "lower" else (lo, hi))
    assert parse_guess("7", 15) == 7 and parse_guess("7 8", 15) is None and parse_guess("16", 15) is None
    assert where_in_interval([("env", "o"), ("policy", "8"), ("env", "higher"), ("policy", "12")]) == [0.5, 0.5]


@pytest.mark.parametrize("last", ["wrong", "right", "invalid"])
def test_the_sixth_guess_is_the_last(last):
    """Five wrong guesses leave the game open; the sixth ends it (done) whatever it is: a
    wrong or invalid one reveals the secret and costs 0.1 (the return -0.6), a right one wins.
    A game that allowed a seventh guess fails here."""
    env = GuessNumber()
    env.reset(7)
    wrong = str(1 if env.secret != 1 else 2)
    for turn in range(GuessNumber.TURNS - 1):
        reply, reward, done = env.step(wrong)
        assert not done and reward == -GuessNumber.COST, (turn, reply)
    final = {"wrong": wrong, "right": str(env.secret), "invalid": "nine"}[last]
    reply, reward, done = env.step(final)
    assert done, (last, reply)
    if last == "right":
        assert (reply, reward) == ("correct", 1.0)
    else:
        assert (reply, reward) == (f"no , it was {env.secret}", -GuessNumber.COST)


# ----------------------------------------------------------------------------- scripts
@pytest.mark.parametrize("algo", ["ppo", "grpo", "rloo", "online_dpo"])
def test_every_algorithm_trains_on_episodes_and_resumes_exactly(guess_sft, tmp_path, algo):
    train_ppo.main(env_cfg(tmp_path / "straight", guess_sft, algo=algo))
    killed_after_first_save(train_ppo, env_cfg(tmp_path / "killed", guess_sft, algo=algo))
    train_ppo.main(env_cfg(tmp_path / "killed", guess_sft, algo=algo, resume=True))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert_same_weights(a["actor"], b["actor"])
    rows = read_metrics(tmp_path / "straight")
    assert rows[-1] == {**read_metrics(tmp_path / "killed")[-1], "time": rows[-1]["time"]}
    train = [r for r in rows if "turns" in r and "split" not in r and "final" not in r]
    assert len(train) == 4 and all(1 <= r["turns"] <= 6 and 0 <= r["success"] <= 1 for r in train)
    assert {"success", "turns", "off_middle", "reward", "kl"} <= set(rows[-1])


def test_groups_share_a_seed_and_seeds_come_from_the_run_seed(guess_sft, tmp_path, monkeypatch):
    seen = []
    real = ppo_trainer.PPOTrainer.play

    def spy(self, seeds, *args, **kwargs):
        seen.append((list(seeds), kwargs.get("for_update", True)))
        return real(self, seeds, *args, **kwargs)
    monkeypatch.setattr(ppo_trainer.PPOTrainer, "play", spy)
    for i, seed in enumerate([1, 1, 2]):
        train_ppo.main(env_cfg(tmp_path / str(i), guess_sft, algo="grpo", seed=seed, max_iters=2,
                               record_rollouts=0))  # the recorded groups would be played too
    runs = [seen[i * 4:(i + 1) * 4] for i in range(3)]  # eval, 2 iterations, eval
    for run in runs:
        assert run[0] == (list(range(8)), False) and run[-1] == (list(range(8)), False)
        for seeds, _ in run[1:3]:
            groups = [seeds[g:g + 4] for g in range(0, 16, 4)]
            assert all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == 4
            assert min(seeds) >= HELD_OUT_SEEDS
    assert runs[0] == runs[1] and runs[0][1] != runs[2][1]


def test_episodes_train_in_bf16_and_with_lora(guess_sft, tmp_path, first_minibatch_kl):
    train_ppo.main(env_cfg(tmp_path / "bf16", guess_sft, algo="grpo", dtype="bfloat16"))
    train_ppo.main(env_cfg(tmp_path / "lora", guess_sft, algo="ppo", lora_rank=4))
    assert max(abs(k) for k in first_minibatch_kl) < 1e-6
    assert read_metrics(tmp_path / "bf16")[-1]["turns"] > 0
    assert read_metrics(tmp_path / "lora")[-1]["turns"] > 0


def test_unmasked_environment_tokens_count_as_actions(guess_sft, tmp_path):
    train_ppo.main(env_cfg(tmp_path / "masked", guess_sft, algo="grpo", max_iters=2))
    train_ppo.main(env_cfg(tmp_path / "unmasked", guess_sft, algo="grpo", max_iters=2, mask_env=False))
    masked, unmasked = (read_metrics(tmp_path / k)[1] for k in ("masked", "unmasked"))
    # the same first rollout: the unmasked run counts the replies' tokens too
    assert unmasked["resp_len"] > masked["resp_len"]


USER_ENV = '''
class Count:
    """Say the number after the one shown; three turns, reward 1 for each right answer."""
    def reset(self, seed):
        self.n, self.turn = seed % 5, 0
        return f"count from {self.n} :"

    def step(self, action):
        self.turn += 1
        right = action == str(self.n + 1)
        self.n += 1
        return f"now {self.n}", float(right), self.turn == 3
'''


def test_a_user_environment_in_a_file_runs_end_to_end(tmp_path, capsys):
    (tmp_path / "count_env.py").write_text(USER_ENV)
    lines = []
    for seed in range(40):
        n = seed % 5
        turns = [{"role": "env", "text": f"count from {n} :"}]
        for k in range(3):
            turns += [{"role": "policy", "text": str(n + k + 1)}, {"role": "env", "text": f"now {n + k + 1}"}]
        lines.append(json.dumps({"turns": turns[:-1]}))
    (tmp_path / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    env = f"{tmp_path / 'count_env.py'}:Count"
    train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft"), data=str(tmp_path / "episodes.jsonl"),
                                    env=env, max_iters=30, eval_interval=30, eval_prompts=4,
                                    batch_size=8, max_new_tokens=3, n_layer=1, n_embd=32,
                                    n_head=2, block_size=48))
    sft = read_metrics(tmp_path / "sft")[-1]
    assert {"reward", "turns"} <= set(sft)
    train_ppo.main(env_cfg(tmp_path / "grpo", tmp_path / "sft", env=env, algo="grpo", max_iters=2))
    assert read_metrics(tmp_path / "grpo")[-1]["turns"] == 3
    capsys.readouterr()
    rows = sample.main(sample.Config(ckpt_dir=str(tmp_path / "grpo"), env=env, num_samples=2,
                                     max_new_tokens=3))
    shown = capsys.readouterr().out
    assert "count from 0 :" in shown and "count from 1 :" in shown and len(rows) == 2
    assert all(len(r["transcript"]) == 7 for r in rows)  # opening + 3 turns + 3 replies


def test_a_person_can_play_the_environment(guess_sft, capsys):
    import io
    stdin = io.StringIO("guess a number from 1 to 15 :\nhigher\n\n")
    rows = sample.main(sample.Config(ckpt_dir=str(guess_sft), play_env=True, max_new_tokens=3),
                       stdin=stdin)
    (row,) = rows
    assert row["turns"] == 2 and row["transcript"][2] == ("env", "higher")
    assert capsys.readouterr().out.count("policy: ") == 2


# ----------------------------------------------------------------------------- bad input
BAD_ENVS = {
    "no_step.py:E": ("class E:\n    def reset(self, seed):\n        return 'guess'\n", "has no method step"),
    "args.py:E": ("class E:\n    def __init__(self, n):\n        pass\n", "with no arguments"),
    "int_reset.py:E": ("class E:\n    def reset(self, seed):\n        return 3\n"
                       "    def step(self, a):\n        return 'higher', 0.0, True\n",
                       "reset returned 3 (int), not the opening text"),
    "pair.py:E": ("class E:\n    def reset(self, seed):\n        return 'guess'\n"
                  "    def step(self, a):\n        return 'higher', 0.0\n", "not (reply: str"),
    "raises.py:E": ("class E:\n    def reset(self, seed):\n        self.t = 0\n        return 'guess'\n"
                    "    def step(self, a):\n        self.t += 1\n"
                    "        if self.t == 2:\n            raise KeyError('boom')\n"
                    "        return 'higher', 0.0, False\n", "step raised KeyError: 'boom' (episode seed 0, turn 2)"),
    "unknown_word.py:E": ("class E:\n    def reset(self, seed):\n        return 'guess'\n"
                          "    def step(self, a):\n        return 'warmer', 0.0, False\n",
                          "cannot encode (warmer)"),
    "long.py:E": ("class E:\n    def reset(self, seed):\n        return 'guess ' * 60\n"
                  "    def step(self, a):\n        return 'higher', 0.0, True\n",
                  "does not fit the context"),
}


@pytest.mark.parametrize("name", sorted(BAD_ENVS))
def test_a_broken_environment_stops_with_one_line(guess_sft, tmp_path, capsys, name):
    source, words = BAD_ENVS[name]
    (tmp_path / name.split(":")[0]).write_text(source)
    line = exits_2(capsys, "train_ppo", ["--sft_dir", guess_sft, "--env", tmp_path / name,
                                         "--out_dir", tmp_path / "run", "--max_new_tokens", "3",
                                         "--max_iters", "2", "--eval_prompts", "4"])
    assert words in line, line


def env_rewarding(reward):
    """An environment whose every step gives `reward`."""
    class E:
        def reset(self, seed):
            return "guess"

        def step(self, action):
            return "higher", reward, False
    env = episodes.Env(E, "e.py:E", seed=3)
    env.reset()
    return env


@pytest.mark.parametrize("reward,expected", [
    (np.float32(0.5), 0.5), (np.float64(-2.0), -2.0), (torch.tensor(0.25), 0.25), (3, 3.0),
    (np.int64(-1), -1.0), (1.5, 1.5)])
def test_an_environments_reward_may_be_any_real_number(reward, expected):
    """As a reward function's scores (rewards.py): numpy's numbers and 0-d tensors are taken."""
    _, got, _ = env_rewarding(reward).step("7")
    assert got == expected and type(got) is float


@pytest.mark.parametrize("reward,words", [
    (True, "is a bool"), (np.bool_(False), "is a bool ("), ("1.0", "is a str"),
    (float("nan"), "is a float nan"), (np.float32("inf"), "is a float32 inf"),
    (1e39, "inf in float32"), (None, "is a NoneType")])
def test_an_environments_reward_that_is_no_finite_number_is_refused_naming_its_type(reward, words):
    with pytest.raises(UserError) as e:
        env_rewarding(reward).step("7")
    line = str(e.value)
    assert words in line and "environment e.py:E: step's reward" in line, line
    assert "(episode seed 3, turn 1)" in line, line


def env_ending(done):
    """An environment whose every step answers `done`."""
    class E:
        def reset(self, seed):
            return "guess"

        def step(self, action):
            return "higher", 0.0, done
    env = episodes.Env(E, "e.py:E", seed=3)
    env.reset()
    return env


@pytest.mark.parametrize("done,expected", [
    (True, True), (False, False), (np.bool_(True), True), (np.int64(3) > 2, True),
    (torch.tensor(False), False), (torch.tensor(5) == 5, True)])
def test_an_environments_done_may_be_pythons_numpys_or_a_0d_tensors_bool(done, expected):
    _, _, got = env_ending(done).step("7")
    assert got is expected


@pytest.mark.parametrize("done,words", [
    (1, "is a int (1)"), (np.int64(1), "is a numpy.int64 (1)"), ("yes", "is a str"),
    (None, "is a NoneType"), (torch.tensor([True]), "is a torch.Tensor of bool and shape (1,)"),
    (torch.tensor(1), "is a torch.Tensor of int64 and shape ()")])
def test_an_environments_done_that_is_no_bool_is_refused_naming_its_type(done, words):
    with pytest.raises(UserError) as e:
        env_ending(done).step("7")
    line = str(e.value)
    assert words in line and "environment e.py:E: step's done (episode seed 3, turn 1)" in line, line
    assert "not a bool" in line and "bool, not a bool" not in line, line


@pytest.mark.parametrize("spec,words", [("nope.py:E", "no file nope.py"), ("os:Nope", "has no 'Nope'"),
                                        ("chess", "not a built-in environment")])
def test_an_environment_that_cannot_be_found_is_named(guess_sft, tmp_path, capsys, spec, words):
    line = exits_2(capsys, "train_ppo", ["--sft_dir", guess_sft, "--env", spec,
                                         "--out_dir", tmp_path / "run"])
    assert words in line, line


def test_an_environment_that_fails_mid_run_leaves_the_last_checkpoint(guess_sft, tmp_path, capsys):
    """Its 49th episode raises: iteration 3, after the checkpoint of iteration 2 (evals of 8
    episodes at 0 and 2, 16 episodes per iteration; no recorded groups, which are played too)."""
    (tmp_path / "late.py").write_text(
        "from mingpt_rlhf.methods.env_guess import GuessNumber\n"
        "class Late(GuessNumber):\n    made = 0\n"
        "    def reset(self, seed):\n        Late.made += 1\n"
        "        if Late.made == 49:\n            raise RuntimeError('out of numbers')\n"
        "        return super().reset(seed)\n")
    cfg = env_cfg(tmp_path / "run", guess_sft, env=f"{tmp_path / 'late.py'}:Late", algo="grpo",
                  record_rollouts=0)
    line = exits_2(capsys, "train_ppo", as_options(cfg))
    assert "reset raised RuntimeError: out of numbers" in line
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == 2


def test_env_options_that_cannot_go_together(guess_sft, tmp_path, capsys):
    base = ["--sft_dir", guess_sft, "--out_dir", tmp_path / "r"]
    assert "drop --reward" in exits_2(capsys, "train_ppo", base + ["--env", "guess", "--reward", "task"])
    assert "--prompts p.jsonl would be ignored" in exits_2(capsys, "train_ppo", base + ["--env", "guess", "--prompts", "p.jsonl"])
    assert "--mask_env false would be ignored" in exits_2(capsys, "train_ppo", base + ["--mask_env", "false"])
    assert "--max_turns must be" in exits_2(capsys, "train_ppo", base + ["--env", "guess", "--max_turns", "0"])
    assert "not both" in exits_2(capsys, "sample", ["--ckpt_dir", guess_sft, "--env", "guess", "--play_env"])


def test_a_reviews_policy_cannot_read_the_game(stages, tmp_path, capsys):
    line = exits_2(capsys, "train_ppo", ["--sft_dir", stages[0] / "sft", "--env", "guess",
                                         "--out_dir", tmp_path / "r", "--max_new_tokens", "3"])
    assert "cannot encode" in line and "seed 0" in line


def test_the_built_in_teacher_is_the_sft_data_of_the_game():
    train, held_out = GuessNumber.teacher_episodes("train", 1), GuessNumber.teacher_episodes("eval", 1)
    assert len(train) == 20000 and len(held_out) == 500
    assert train[:3] == GuessNumber.teacher_episodes("train", 1)[:3]
    assert train[:3] != GuessNumber.teacher_episodes("train", 2)[:3]
    from mingpt_rlhf.methods.env_guess import TRAINING_SEEDS_FROM
    assert TRAINING_SEEDS_FROM == HELD_OUT_SEEDS
    assert os.path.basename(__file__) == "test_episodes.py"


def test_the_calculator_example_is_a_tool_the_policy_can_call():
    from mingpt_rlhf.methods.episodes import load_env
    calculator, _ = load_env(os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                          "examples", "calculator_env.py") + ":Calculator")
    env = calculator()
    opening = env.reset(7)
    a, b = int(opening.split()[2]), int(opening.split()[4])
    reply, reward, done = env.step(f"calc {a} * {b}")
    assert (reply, reward, done) == (str(a * b), 0.0, False)
    assert env.step("hello") == ("say calc X * Y or answer N", -0.1, False)
    assert env.step(f"answer {a * b}") == ("ok", 1.0, True)
    assert env.step("answer 1")[1:] == (0.0, True)


class OneTurn:
    """An episode of one turn: the opening is a prompt, the first answer ends it."""

    def reset(self, seed):
        return ["guess a number from 1 to 15 :", "guess a number"][seed % 2]

    def step(self, action):
        return "correct", 0.0, True


def test_an_episode_of_one_turn_is_a_single_turn_rollout():
    """The episode sampler and the single-turn sampler draw the same tokens with the same
    generator, with the same log-probs: a prompt is the opening of an episode of one turn."""
    from mingpt_rlhf.sampling import generate
    tok = GuessNumber.tokenizer()
    model = tiny_policy(tok)
    ep = play_episodes(model, tok, OneTurn, [0, 1, 2, 3], max_turns=4, max_new_tokens=5,
                       generator=torch.Generator().manual_seed(3), score=True)
    prompts = [tok.encode(OneTurn().reset(s)) for s in range(4)]
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    out = generate(model, ids, (ids != 0).long(), 5, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
                   generator=torch.Generator().manual_seed(3), score=True)
    n = ep.sequences.size(1)
    assert torch.equal(ep.sequences, out.sequences[:, :n]) and (out.sequences[:, n:] == 0).all()
    assert torch.equal(ep.action_mask, out.action_mask[:, :n])
    torch.testing.assert_close(ep.logprobs, out.logprobs[:, :n - T], atol=1e-6, rtol=0)


def test_sample_compares_two_policies_on_the_same_episodes(guess_sft, capsys):
    rows = sample.main(sample.Config(ckpt_dir=str(guess_sft), compare=str(guess_sft), env="guess",
                                     num_samples=2, env_seed=5, max_new_tokens=3))
    assert [(r["policy"], r["seed"]) for r in rows] == [(str(guess_sft), 5), (str(guess_sft), 6)] * 2
    # the same policy and the same seed draw the same episodes
    assert [r["transcript"] for r in rows[:2]] == [r["transcript"] for r in rows[2:]]
    assert capsys.readouterr().out.count("episode seed 5") == 2


class Openings:
    """Openings of 20 words or 2, and "ok" forever: only the context ends an episode."""

    def reset(self, seed):
        return " ".join(["guess"] * (20 if seed % 2 == 0 else 2))

    def step(self, action):
        return "higher", 0.0, False


def test_episodes_of_different_openings_fit_the_context_together():
    """The rows are compacted to one width (the longest opening + the longest run of turns):
    that width fits block_size, so the trainer can score them."""
    tok = GuessNumber.tokenizer()
    model = tiny_policy(tok, block_size=32)
    ep = play_episodes(model, tok, Openings, [0, 1], max_turns=50, max_new_tokens=4,
                       generator=torch.Generator().manual_seed(0))
    assert ep.ended_by == ["context", "context"] and ep.sequences.size(1) <= 32
    with torch.no_grad():
        model.trunk(ep.sequences, ep.attention_mask)  # no "longer than block_size"


def test_an_environment_whose_figures_raise_stops_with_one_line(guess_sft, tmp_path, capsys):
    (tmp_path / "figs.py").write_text(
        "from mingpt_rlhf.methods.env_guess import GuessNumber\n"
        "class Figs(GuessNumber):\n    @classmethod\n"
        "    def figures(cls, transcripts, returns):\n        raise ValueError('no figures')\n")
    line = exits_2(capsys, "train_ppo", ["--sft_dir", guess_sft, "--env", f"{tmp_path / 'figs.py'}:Figs",
                                         "--out_dir", tmp_path / "run", "--max_new_tokens", "3",
                                         "--eval_prompts", "4"])
    assert "figures raised ValueError: no figures" in line
