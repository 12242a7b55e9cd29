"""Online DPO (mingpt_rlhf/methods/online_dpo.py, `--algo online_dpo`): the pairs by hand, the loss
against methods/dpo.py's on the same numbers, the pairs kept whole through the replay buffer, a run
that learns, resumes exactly with a lagging sampler, and refuses what it cannot take. Its
expected gradient is a row of the gradient oracle (tests/test_gradients.py)."""
import dataclasses
import math

import pytest
import torch

import conftest
import train_ppo
from mingpt_rlhf.methods.dpo import dpo_loss
from mingpt_rlhf.methods.online_dpo import pair_loss, pair_rows, preference_signs, row_signs
from mingpt_rlhf.ppo import ReplayBuffer
from mingpt_rlhf.ppo_trainer import resolve_auto_options
from test_critic_free import grouped_prompts
from test_offpolicy import LagCfg
from test_ppo_trainer import make_trainer
from test_scripts import assert_same_weights, killed_after_first_save, ppo_cfg, read_metrics


def test_the_best_and_the_worst_of_each_group_make_the_pair():
    scores = torch.tensor([0.2, 0.9, 0.5, 0.1,     # best row 1, worst row 3
                           0.4, 0.4, 0.4, 0.4,     # all equal: no pair
                           1.0, -1.0, 1.0, -1.0])  # ties: the first best and the first worst
    signs = preference_signs(scores, 4)
    assert signs.tolist() == [0, 1, 0, -1, 0, 0, 0, 0, 1, -1, 0, 0]
    # one pair per group; the group without a preference gives its first two rows
    assert pair_rows(signs, 4).tolist() == [1, 3, 4, 5, 8, 9]


def test_the_pair_loss_is_dpos_loss_on_the_same_pairs_in_either_order():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0.]])
    logprobs, ref = torch.randn(4, 3) * mask, torch.randn(4, 3) * mask
    sums, ref_sums = (logprobs * mask).sum(-1), (ref * mask).sum(-1)
    # pair 1: row 0 chosen; pair 2: row 3 chosen (the rejected row comes first)
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None] * mask
    for loss in ("sigmoid", "ipo"):
        got = pair_loss(logprobs, ref, signs, mask, 0.3, loss)
        want, _ = dpo_loss(sums[[0, 3]], sums[[1, 2]], ref_sums[[0, 3]], ref_sums[[1, 2]], 0.3, loss)
        torch.testing.assert_close(got, want)
    # a pair without a preference counts for nothing, and none at all gives 0
    no_pair = torch.tensor([1.0, -1.0, 0.0, 0.0])[:, None] * mask
    want, _ = dpo_loss(sums[[0]], sums[[1]], ref_sums[[0]], ref_sums[[1]], 0.3)
    torch.testing.assert_close(pair_loss(logprobs, ref, no_pair, mask, 0.3, "sigmoid"), want)
    assert pair_loss(logprobs, ref, 0 * signs, mask, 0.3, "sigmoid").item() == 0
    # at the start (policy = reference) the loss is log 2, as offline DPO's
    assert pair_loss(ref, ref, signs, mask, 0.3, "sigmoid").item() == pytest.approx(math.log(2))


def test_the_buffer_shuffles_pairs_but_keeps_each_whole():
    trainer = make_trainer(resolve_auto_options(LagCfg(algo="online_dpo", group_size=2,
                                                       minibatch_size=4)), critic_free=True)
    exp, _ = trainer.make_experience(*grouped_prompts(8, 2), torch.Generator().manual_seed(0))
    buffer = ReplayBuffer(trainer.pad_id)
    buffer.add(dataclasses.replace(exp, scores=torch.arange(16.0)))   # each row's score: its index
    seen = []
    for mb in buffer.minibatches(4, torch.Generator().manual_seed(1), unit=2):
        rows = [int(i) for i in mb.scores]
        seen += rows
        assert all(rows[j] // 2 == rows[j + 1] // 2 and rows[j] % 2 == 0 for j in range(0, len(rows), 2))
    assert sorted(seen) == list(range(16)) and seen != list(range(16))


def test_a_step_learns_from_one_pair_per_group_and_lowers_their_loss():
    trainer = make_trainer(resolve_auto_options(LagCfg(algo="online_dpo", group_size=4, ppo_epochs=4,
                                                       minibatch_size=8, actor_lr=1e-2)), critic_free=True)
    learned = []
    real = trainer.buffer.add
    trainer.buffer.add = lambda exp: (learned.append(exp), real(exp))
    exp, stats = trainer.step([grouped_prompts(8, 4)], torch.Generator().manual_seed(0))
    pairs = learned[0]
    signs = row_signs(pairs.advantages, pairs.action_mask)
    assert len(signs) == 16                                             # one pair per group
    valid = signs[0::2] != 0
    assert valid.sum() == 8 - round(stats["zero_groups"] * 8) > 0       # ties: signs 0
    assert (signs[0::2][valid] == 1).all() and (signs[1::2][valid] == -1).all()
    assert (signs[0::2][~valid] == 0).all() and (signs[1::2][~valid] == 0).all()
    assert (pairs.scores[0::2][valid] > pairs.scores[1::2][valid]).all()  # chosen scored higher
    with torch.no_grad():
        after = trainer.policy_and_values(pairs.sequences, pairs.attention_mask, pairs.prompt_len,
                                          with_values=False)[0]
    before = pair_loss(pairs.logprobs, pairs.ref_logprobs, pairs.advantages, pairs.action_mask, 0.3, "sigmoid")
    now = pair_loss(after, pairs.ref_logprobs, pairs.advantages, pairs.action_mask, 0.3, "sigmoid")
    assert before.item() == pytest.approx(math.log(2), abs=1e-5) and now < before - 1e-3


def test_online_dpo_runs_and_resumes_exactly_with_a_lagging_sampler(stages, tmp_path):
    root = stages[0]
    kw = dict(algo="online_dpo", sampler_lag=2, max_iters=4, eval_interval=2)
    straight = train_ppo.main(ppo_cfg(tmp_path / "straight", root / "sft", root / "rm", **kw))
    killed_after_first_save(train_ppo, ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", **kw))
    train_ppo.main(ppo_cfg(tmp_path / "killed", root / "sft", root / "rm", resume=True, **kw))
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert_same_weights(a["actor"], b["actor"])
    assert a["config"]["group_size"] == 2 and a["critic"] is None and a["value_head"] is None
    train = [e for e in read_metrics(tmp_path / "straight") if "pg_loss" in e]
    # the first update starts at log 2 (policy = reference) and its minibatches lower it
    assert 0.6 < train[0]["pg_loss"] < math.log(2)
    assert train[-1]["mismatch_kl"] > 0 and math.isfinite(straight["gold"])


@pytest.mark.parametrize("argv,needle", [
    (["--algo", "online_dpo", "--offpolicy", "tis"], "has no ratio to the sampler"),
    (["--algo", "online_dpo", "--minibatch_size", "7"], "--minibatch_size must be even"),
    (["--algo", "online_dpo", "--dpo_loss", "hinge"], "--dpo_loss must be sigmoid or ipo"),
    (["--algo", "online_dpo", "--dpo_beta", "0"], "--dpo_beta must be > 0"),
    (["--algo", "online_dpo", "--dynamic_sampling", "2"], "--dynamic_sampling 2 would be ignored"),
    # its KL to the reference is --dpo_beta: PPO's KL penalty and controller are not read
    (["--algo", "online_dpo", "--kl_in", "loss"], "--kl_in loss would be ignored"),
    (["--algo", "online_dpo", "--kl_coef", "0.2"], "KL to the reference is --dpo_beta"),
    (["--algo", "online_dpo", "--kl_estimator", "k3"], "KL to the reference is --dpo_beta"),
    (["--algo", "online_dpo", "--adaptive_kl", "false"], "KL to the reference is --dpo_beta"),
    (["--algo", "online_dpo", "--kl_horizon", "5"], "its KL is --dpo_beta"),
    (["--algo", "dpo"], "--algo must be ppo, grpo, rloo, reinforce++, online_dpo or distill"),
])
def test_impossible_online_dpo_options_exit_2(tmp_path, capsys, argv, needle):
    line = conftest.exits_2(capsys, "train_ppo", ["--out_dir", str(tmp_path / "r"), *argv])
    assert needle in line, line
