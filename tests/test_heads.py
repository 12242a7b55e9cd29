"""Reward model and critic: score at the last real token, pairwise loss math, learning."""
import copy
import math

import pytest
import torch

from conftest import left_pad
from mingpt_rlhf.data import right_pad
from mingpt_rlhf.heads import Critic, RewardModel, last_real_index, pairwise_loss
from mingpt_rlhf.model import GPTConfig

CFG = GPTConfig(vocab_size=12, block_size=32, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture
def rm():
    torch.manual_seed(0)
    return RewardModel(CFG).eval()


def test_last_real_index_left_and_right():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    assert last_real_index(mask).tolist() == [2, 4, 2]


def test_score_is_read_at_the_last_real_token(rm):
    rows = [[3, 4, 5, 1], [6, 7, 1], [8, 9, 10, 11, 5, 1]]
    alone = torch.stack([rm(torch.tensor([r]))[0] for r in rows])
    right = rm(*right_pad(rows, 0))
    left = rm(*left_pad(rows, 0))
    torch.testing.assert_close(right, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(left, alone, rtol=0, atol=1e-5)
    # appending more pad tokens never changes the score
    ids, mask = right_pad(rows, 0)
    more = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(rm(more, torch.cat([mask, torch.zeros(3, 4, dtype=torch.long)], 1)),
                               alone, rtol=0, atol=1e-5)
    # and the score is the head at that token, not at a pad position
    per_token = rm.token_scores(ids, mask)
    torch.testing.assert_close(right, torch.stack([per_token[i, len(r) - 1] for i, r in enumerate(rows)]))


def test_pairwise_loss_hand_computed():
    c, r = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0])
    expected = [math.log(1 + math.exp(-1)), math.log(2), math.log(1 + math.exp(2))]
    assert pairwise_loss(c, r).item() == pytest.approx(sum(expected) / 3, rel=1e-6)
    # with a margin m the loss is -log sigmoid(d - m)
    assert pairwise_loss(torch.tensor([1.0]), torch.tensor([0.0]), margin=0.5).item() == \
        pytest.approx(math.log(1 + math.exp(-0.5)), rel=1e-6)


def test_pairwise_loss_is_finite_for_large_gaps():
    big = pairwise_loss(torch.tensor([-100.0]), torch.tensor([0.0]))
    assert torch.isfinite(big) and big.item() == pytest.approx(100.0, rel=1e-4)
    small = pairwise_loss(torch.tensor([100.0]), torch.tensor([0.0]))
    assert torch.isfinite(small) and 0 <= small.item() < 1e-30
    c = torch.tensor([-100.0], requires_grad=True)
    pairwise_loss(c, torch.tensor([0.0])).backward()
    assert torch.isfinite(c.grad).all() and c.grad.item() == pytest.approx(-1.0)


def test_normalisation_gives_mean_0_std_1(rm):
    raw = torch.randn(200) * 3 + 7
    rm.set_normalisation(raw)
    normed = rm.gain * raw + rm.bias
    assert normed.mean().item() == pytest.approx(0, abs=1e-5)
    assert normed.std().item() == pytest.approx(1, abs=1e-5)


def test_critic_loads_the_reward_model_and_starts_from_its_head(rm):
    critic = Critic(CFG).eval()
    assert (critic.head.weight == 0).all()  # a fresh critic's values are 0
    critic.load_trunk_and_head(rm.state_dict())
    ids, mask = right_pad([[3, 4, 5, 1], [6, 1]], 0)
    torch.testing.assert_close(critic(ids, mask), rm.token_scores(ids, mask))
    assert critic(ids, mask).shape == (2, 4)


def test_critic_from_a_normalised_reward_model_speaks_in_normalised_units(rm):
    """PPO's rewards are normalised RM scores, so an RM-initialised critic must start on that
    scale: its value at the last real token is the normalised score, not the raw one. The
    head has a bias, as a trained one does (a fresh head's is 0): the gain scales it too."""
    with torch.no_grad():
        rm.head.bias.fill_(0.8)
    rm.set_normalisation(torch.randn(100) * 3.7 + 1.4)  # the default pipeline's raw scale
    assert abs(rm.gain.item() - 1) > 0.1 and abs(rm.bias.item()) > 0.1
    critic = Critic(CFG).eval()
    critic.load_trunk_and_head(rm.state_dict())
    ids, mask = left_pad([[3, 4, 5, 1], [6, 1]], 0)  # last real token: column 3 in both rows
    with torch.no_grad():
        torch.testing.assert_close(critic(ids, mask)[:, -1], rm(ids, mask))
        assert not torch.allclose(critic(ids, mask)[:, -1], rm(ids, mask, normalise=False))


def test_reward_model_learns_a_preference():
    """'responses containing token 7 are preferred': > 90% held-out accuracy in a few dozen steps."""
    g = torch.Generator().manual_seed(0)

    def pairs(n):
        base = torch.randint(3, 7, (n, 6), generator=g)      # tokens 3..6, never 7
        chosen = base.clone()
        pos = torch.randint(0, 6, (n,), generator=g)
        chosen[torch.arange(n), pos] = 7
        rejected = torch.randint(3, 7, (n, 6), generator=g)
        eos = torch.ones(n, 1, dtype=torch.long)
        return torch.cat([chosen, eos], 1), torch.cat([rejected, eos], 1)

    torch.manual_seed(0)
    model = RewardModel(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        c, r = pairs(32)
        scores = model(torch.cat([c, r]))
        loss = pairwise_loss(scores[:32], scores[32:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    c, r = pairs(500)
    with torch.no_grad():
        acc = (model(c) > model(r)).float().mean().item()
    assert acc > 0.9, acc


def test_scores_and_values_stay_float32_under_bf16_autocast(rm):
    """Autocast would run the head in bf16: scores rounded to steps of 2**-7 near 1..2, so
    rewards move in steps and RM accuracy counts rounding ties as mistakes. The heads compute
    in float32 (and hold_frozen_in leaves their weights in float32)."""
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    torch.manual_seed(1)
    rm.set_normalisation(torch.randn(64) * 0.7 + 0.3)  # gain and bias that are not 1 and 0
    critic = Critic(CFG)
    critic.load_trunk_and_head(rm.state_dict())
    frozen = hold_frozen_in(copy.deepcopy(rm).requires_grad_(False), torch.bfloat16)
    assert frozen.head.weight.dtype == torch.float32
    ids, mask = left_pad([[3, 4, 5, 1], [6, 7, 1], [8, 9, 10, 11, 5, 1]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = rm.gpt.trunk(ids, mask)
        scores, frozen_scores, values = rm(ids, mask), frozen(ids, mask), critic(ids, mask)
    assert scores.dtype == frozen_scores.dtype == values.dtype == torch.float32
    head = hidden.float() @ rm.head.weight.float().T + rm.head.bias.float()   # (B, T, 1)
    expected = rm.gain * head[torch.arange(3), last_real_index(mask), 0] + rm.bias
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(values[torch.arange(3), last_real_index(mask)], expected,
                               rtol=0, atol=1e-5)
