"""The gradient oracle (mingpt_rlhf/gradients.py): a world small enough to list every response,
where the regularised objective, its gradient and its maximiser are exact."""
import torch

from mingpt_rlhf.gradients import (MAX_LEN, PAD, RESPONSES, TabularPolicy, kl, make_world,
                                   objective, objective_gradient, optimal_policy,
                                   optimal_value, response_batch, response_logprobs)
from mingpt_rlhf.logprobs import sequence_logprobs

WORLD = make_world()


def test_the_world_lists_every_response_once_and_their_probabilities_sum_to_1():
    assert len(set(RESPONSES)) == len(RESPONSES) == 15
    assert all(1 <= len(y) <= MAX_LEN for y in RESPONSES)
    for table in (WORLD.ref, torch.randn(WORLD.ref.shape, dtype=torch.float64)):
        total = response_logprobs(table).exp().sum().item()
        assert abs(total - 1) < 1e-14


def test_the_package_scores_the_tabular_policy_as_the_table_says():
    """The trainer's log-prob path (trunk, the T-1 shift, lm_logprobs with PAD suppressed)
    gives each response the log-prob the table gives it directly."""
    policy = TabularPolicy(WORLD.ref)
    sequences, attention_mask, action_mask = response_batch()
    logprobs, _ = sequence_logprobs(policy, sequences, attention_mask, 1, suppress=PAD)
    summed = (torch.where(action_mask.bool(), logprobs, 0.0)).sum(-1)
    torch.testing.assert_close(summed, response_logprobs(WORLD.ref), rtol=0, atol=1e-14)


def test_pi_star_is_the_maximiser_of_J():
    star = optimal_policy(WORLD)
    # pi* = ref exp(r / beta) / Z, as a distribution over responses
    logits = response_logprobs(WORLD.ref) + WORLD.reward / WORLD.beta
    torch.testing.assert_close(response_logprobs(star), torch.log_softmax(logits, 0),
                               rtol=0, atol=1e-14)
    assert objective_gradient(star, WORLD).abs().max().item() < 1e-14
    best = objective(star, WORLD).item()
    assert abs(best - optimal_value(WORLD)) < 1e-14
    gen = torch.Generator().manual_seed(1)
    for scale in (1e-3, 0.1, 1.0):
        moved = star + scale * torch.randn(star.shape, generator=gen, dtype=torch.float64)
        assert objective(moved, WORLD).item() < best
    # J(pi) = J(pi*) - beta KL(pi || pi*): the gap is exactly the KL to the optimum
    gap = best - objective(WORLD.ref, WORLD).item()
    assert abs(gap - WORLD.beta * kl(WORLD.ref, star).item()) < 1e-14
