"""DPO: the loss against hand computations, its gradient's direction, padding invariance of the
summed log-probs, and learning on a tiny model."""
import math

import pytest
import torch

from conftest import left_pad
from mingpt_rlhf.data import right_pad
from mingpt_rlhf.methods.dpo import dpo_loss, response_logprob_sums
from mingpt_rlhf.model import GPT, GPTConfig


def tiny(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=12, block_size=16, n_layer=1, n_head=2, n_embd=32)).eval()


def test_loss_is_log_2_when_the_policy_is_the_reference():
    lp = torch.tensor([-3.0, -7.5, -1.0])
    lr = torch.tensor([-2.0, -9.0, -4.0])
    loss, stats = dpo_loss(lp, lr, lp.clone(), lr.clone(), beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    assert stats["margin"].item() == 0.0 and stats["reward_acc"].item() == 0.0


def test_loss_matches_a_hand_computation():
    # h = (-3 - -4) - (-6 - -5) = 1 - (-1) = 2; beta 0.5 -> -log sigmoid(1) = log(1 + e^-1)
    loss, stats = dpo_loss(torch.tensor([-3.0]), torch.tensor([-6.0]), torch.tensor([-4.0]),
                           torch.tensor([-5.0]), beta=0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)))
    assert stats["chosen_reward"].item() == pytest.approx(0.5)
    assert stats["rejected_reward"].item() == pytest.approx(-0.5)
    assert stats["margin"].item() == pytest.approx(1.0) and stats["reward_acc"].item() == 1.0
    # IPO: (h - 1 / (2 tau))^2 = (2 - 1)^2
    ipo, _ = dpo_loss(torch.tensor([-3.0]), torch.tensor([-6.0]), torch.tensor([-4.0]),
                      torch.tensor([-5.0]), beta=0.5, loss="ipo")
    assert ipo.item() == pytest.approx(1.0)


def test_gradient_raises_the_chosen_and_lowers_the_rejected_log_prob():
    chosen = torch.tensor([-3.0], requires_grad=True)
    rejected = torch.tensor([-3.0], requires_grad=True)
    loss, _ = dpo_loss(chosen, rejected, torch.tensor([-3.0]), torch.tensor([-3.0]), beta=0.1)
    loss.backward()
    # gradient descent moves against the gradient: chosen up, rejected down, by beta / 2 each
    assert chosen.grad.item() == pytest.approx(-0.05) and rejected.grad.item() == pytest.approx(0.05)


def test_summed_log_probs_are_padding_invariant_and_cover_the_response_only():
    model = tiny()
    rows = [[3, 4, 5, 6, 7], [3, 8, 9], [2, 2, 4, 5, 6, 9, 10]]
    n_prompt = [2, 1, 4]
    ids, mask = left_pad(rows, 0)
    resp = mask.clone()
    for i, r in enumerate(rows):
        resp[i, :ids.size(1) - len(r) + n_prompt[i]] = 0
    with torch.no_grad():
        batched = response_logprob_sums(model, ids, mask, resp)
        for i, r in enumerate(rows):
            alone = torch.tensor([r])
            hidden = model.trunk(alone)[0]
            lp = torch.log_softmax(model.logits(hidden), -1)
            by_hand = sum(lp[t - 1, r[t]].item() for t in range(n_prompt[i], len(r)))
            assert batched[i].item() == pytest.approx(by_hand, abs=1e-5)
        # right-padded gives the same sums
        rids, rmask = right_pad(rows, 0)
        rresp = rmask.clone()
        for i in range(len(rows)):
            rresp[i, :n_prompt[i]] = 0
        torch.testing.assert_close(response_logprob_sums(model, rids, rmask, rresp), batched,
                                   atol=1e-5, rtol=0)


def test_dpo_learns_a_preference_on_a_tiny_model():
    """Chosen responses use token 5, rejected token 9: after a few steps the policy prefers 5."""
    import copy
    model = tiny(1)
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    prompts = torch.randint(1, 5, (16, 3), generator=torch.Generator().manual_seed(0))
    chosen = torch.cat([prompts, torch.full((16, 3), 5)], 1)
    rejected = torch.cat([prompts, torch.full((16, 3), 9)], 1)
    ids = torch.cat([chosen, rejected])
    mask = torch.ones_like(ids)
    resp = mask.clone()
    resp[:, :3] = 0
    with torch.no_grad():
        base = response_logprob_sums(ref, ids, mask, resp)
    losses = []
    for _ in range(30):
        own = response_logprob_sums(model, ids, mask, resp)
        loss, stats = dpo_loss(own[:16], own[16:], base[:16], base[16:], beta=0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert losses[-1] < 0.1 and stats["reward_acc"].item() == 1.0
