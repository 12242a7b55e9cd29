"""`max_logratio` (run/watch.py): the largest log pi(v) - log ref(v) over the whole
vocabulary at a rollout's action positions. It is 0 for the reference itself, equals a
straightforward computation from the models' full logits, and it sees probability move onto a
token the rollouts never sample (the duel game's empty answer) while the KL of the sampled
tokens does not."""
import torch

from mingpt_rlhf.run.watch import largest_logratio

from test_ppo_trainer import PAD, make_trainer, prompts


def rollout(tr, seed=0):
    exp, _ = tr.make_experience(*prompts(seed=seed), torch.Generator().manual_seed(seed))
    return exp


def shift_logit(model, token: int, nats: float):
    """Add `nats` to `token`'s logit at every position (the output layer wrapped)."""
    logits = model.logits
    bump = torch.zeros(model.config.vocab_size)
    bump[token] = nats
    model.logits = lambda hidden: logits(hidden) + bump


def rows(exp, n):
    return exp.select(torch.arange(n))


def by_hand(tr, exp, rows):
    """The same figure from each model's full logits over every position, the plain way."""
    def logp(model):
        hidden = model.trunk(exp.sequences[:rows], exp.attention_mask[:rows])
        logits = model.logits(hidden)[:, exp.prompt_len - 1:-1].float()
        logits[..., PAD] = float("-inf")
        return torch.log_softmax(logits, -1)
    with torch.no_grad():
        ratio = logp(tr.actor) - logp(tr.ref)                        # (rows, N, V)
    ratio[..., PAD] = float("-inf")
    return ratio[exp.action_mask[:rows].bool()].max().item()


def test_the_reference_itself_reads_zero():
    tr = make_trainer()
    assert largest_logratio(tr, rollout(tr)) == 0.0


def test_it_is_the_largest_ratio_over_vocabulary_and_actions():
    tr = make_trainer()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in tr.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    exp = rollout(tr)
    got = largest_logratio(tr, rows(exp, 8))
    assert got > 0.01  # the weights moved; two distributions that differ: some ratio > 1
    assert abs(got - by_hand(tr, exp, 8)) < 1e-5
    assert abs(largest_logratio(tr, exp) - by_hand(tr, exp, 16)) < 1e-5
    assert largest_logratio(tr, exp) >= got  # more rows, more positions to take it over


def test_it_sees_mass_moving_onto_a_token_no_rollout_samples():
    """A token both models find e^-12-unlikely at every position; the policy raises it by
    5 nats after the rollout (as an update might). The sampled tokens' KL barely moves; the
    figure reads the 5 nats."""
    tr = make_trainer()
    rare = 5
    for model in (tr.actor, tr.ref):
        shift_logit(model, rare, -12.0)
    exp = rollout(tr)
    assert not (exp.sequences[:, exp.prompt_len:][exp.action_mask.bool()] == rare).any()
    shift_logit(tr.actor, rare, 5.0)   # the "update"
    with torch.no_grad():
        now = tr.policy_and_values(exp.sequences, exp.attention_mask, exp.prompt_len)[0]
    sampled_kl = ((now - exp.ref_logprobs) * exp.action_mask).sum() / exp.action_mask.sum()
    assert abs(sampled_kl) < 0.01, sampled_kl
    assert 4.9 < largest_logratio(tr, exp) <= 5.0


def test_with_lora_the_reference_is_the_actor_with_its_adapters_off():
    """No reference copy (LoRA): the figure is the one a frozen copy of the base would give."""
    from mingpt_rlhf.machinery.lora import add_lora
    tr = make_trainer()
    add_lora(tr.actor, 2, 4.0)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in tr.actor.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn_like(p))
    exp = rollout(tr)
    with_copy = by_hand(tr, exp, 16)      # tr.ref: the base's copy from make_trainer
    assert with_copy > 0.01
    tr.ref = None
    assert abs(largest_logratio(tr, exp) - with_copy) < 1e-5


def test_it_reads_the_first_minibatch_the_update_trained_on():
    """The figure's rows are those of the update's first (shuffled) minibatch, not the rollout's
    first rows in their sampled order: the trainer keeps that minibatch, whose rows are the
    first of the shuffle's permutation. An update that trained on nothing reads 0."""
    tr = make_trainer()
    exp = rollout(tr)
    tr.buffer.add(exp)
    shuffle = torch.Generator().manual_seed(5)
    first_rows = torch.randperm(len(exp.scores), generator=torch.Generator().manual_seed(5))
    first_rows = first_rows[:tr.cfg.minibatch_size]
    tr.learn(shuffle)
    mb = tr.first_minibatch
    assert len(mb.scores) == tr.cfg.minibatch_size and not torch.equal(first_rows, torch.arange(len(first_rows)))
    torch.testing.assert_close(mb.scores, exp.scores[first_rows])
    assert abs(largest_logratio(tr, mb) - by_hand(tr, exp.select(first_rows), len(first_rows))) < 1e-5
    assert largest_logratio(tr, None) == 0.0
