"""A random reward, exactly (lab/spurious.py): the expected update is 0 at ratio 1 and without
the clip, and the clip alone makes it move on a later minibatch."""
import dataclasses

import pytest
import torch

from mingpt_rlhf.lab.gradients import Row, _spec, evaluation_point, expected_update
from mingpt_rlhf.lab.spurious import NO_CLIP, clip_bias, rows
from mingpt_rlhf.lab.tabular import make_world


def by_name():
    return {row.name: row for row in rows(0.2)}


@pytest.mark.parametrize("advantages", ["dr_grpo", "rloo"])
def test_a_coin_reward_moves_nothing_without_the_clip(advantages):
    """The advantage of a response does not depend on the response: at ratio 1 the expected
    update is 0 whatever the clip, and on a later minibatch the unclipped ratio reweighs the
    batch to the learner's own distribution, so it is 0 there too."""
    named = by_name()
    for name in (f"{advantages}, ratio 1, clip 0.2", f"{advantages}, ratio 1, no clip",
                 f"{advantages}, a later minibatch, no clip"):
        assert clip_bias(named[name])["update_norm"] < 1e-12, name


def test_the_clip_alone_moves_the_policy_under_a_coin_reward():
    """World 0's learner is one step from its sampler, far enough that some ratios leave
    [0.8, 1.2]: the clip drops some terms by the sign of their advantage, and the expected
    update is no longer 0. It pulls the learner back towards the sampler."""
    result = clip_bias(by_name()["rloo, a later minibatch, clip 0.2"])
    assert result["update_norm"] > 1e-3
    assert result["corr_with_way_back"] > 0.3


def test_the_coin_outcomes_are_listed_with_their_probabilities():
    """With the KL in the loss, a coin reward's update at ratio 1 is the KL term's alone: the
    same as under a reward of 0.5 everywhere, which gives every advantage 0. Outcomes left
    out, or weighed other than 1 / 2^n each, would scale or bend that term."""
    world = make_world(0, beta=0.5)
    table, _ = evaluation_point(world)
    row = Row("x", _spec(advantages="dr_grpo", reduction="budget", kl_in="loss",
                         kl_estimator="k3"))
    flat = dataclasses.replace(world, reward=torch.full_like(world.reward, 0.5))
    kl_alone = expected_update(row, table, flat)
    assert kl_alone.norm() > 1e-3
    torch.testing.assert_close(expected_update(row, table, world, coin=True), kl_alone,
                               rtol=1e-10, atol=1e-12)


def test_coin_rewards_refuse_a_critic():
    world = make_world(0)
    with pytest.raises(ValueError, match="without a critic"):
        expected_update(Row("gae", _spec(advantages="gae")), world.ref, world, coin=True)
