"""The enumerable world (mingpt_rlhf/lab/tabular.py) and the gradient oracle on it
(mingpt_rlhf/lab/gradients.py): the regularised objective, its gradient and its maximiser exact;
every configuration of the trainer's table moves the policy as its formula says; DPO, IPO
and the reward model minimised where their derivations say."""
import itertools

import pytest
import torch

from mingpt_rlhf.lab.gradients import (FOLLOWS, ROWS, arbitrary_values, evaluation_point,
                                       exact_ascent, expected_update, local_kl_gradient,
                                       semi_gradient, world_of)
from mingpt_rlhf.logprobs import sequence_logprobs
from mingpt_rlhf.losses import GROUP_BASELINES, TABLES
from mingpt_rlhf.lab.offpolicy import OFFPOLICY
from mingpt_rlhf.lab.tabular import (MAX_LEN, PAD, PREFIXES, RESPONSES, TabularPolicy,
                                     ipo_optimal_policy, kl, make_world, objective,
                                     objective_gradient, optimal_policy, optimal_value,
                                     preference_loss, response_batch, response_logprobs,
                                     reward_model_loss, visits)

WORLD = make_world()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The world's tensors are tiny: a second thread costs more than it brings (tenfold on
    a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


# ----------------------------------------------------------------------------- the oracle's rows

TABLE, BEHIND = evaluation_point(WORLD)
INDEX = {p: i for i, p in enumerate(PREFIXES)}
# each response's (prefix index, column of the token among EOS, A, B) per position
STEPS = [[(INDEX[y[:t]], tok - 1) for t, tok in enumerate(y)] for y in RESPONSES]
MASK = torch.tensor([[1.0 if t < len(y) else 0.0 for t in range(MAX_LEN)] for y in RESPONSES],
                    dtype=torch.float64)


def token_logprobs(table):
    """(Y, N) log pi of each response's tokens (0 past its end), from the table by hand."""
    cond = torch.log_softmax(table[:, 1:], -1)
    rows = [[cond[p, c] for p, c in s] + [torch.zeros((), dtype=torch.float64)] * (MAX_LEN - len(s))
            for s in STEPS]
    return torch.stack([torch.stack(r) for r in rows])


def estimate(name, d):
    return {"k1": d, "k2": d ** 2 / 2, "k3": torch.exp(-d) + d - 1}[name]


def slope(name, d):
    """d(estimate) / d(log pi) at a token whose log-ratio to the reference is d."""
    return {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d)}[name]


def values_under(prob, rewards):
    """(Y, N) exact values: at each token, the sampler's expected sum of the rewards from it
    on, over the responses that share the prefix before it."""
    to_go = torch.stack([rewards[:, t:].sum(-1) for t in range(MAX_LEN)], -1)
    out = torch.zeros_like(rewards)
    for i, y in enumerate(RESPONSES):
        for t in range(len(y)):
            same = torch.tensor([z[:t] == y[:t] for z in RESPONSES])
            out[i, t] = (prob[same] * to_go[same, t]).sum() / prob[same].sum()
    return out


def whiten(x, mask):
    """Over each batch's real tokens: (x - mean) / sqrt(var + 1e-8)."""
    count = mask.sum((-1, -2), keepdim=True)
    mean = (x * mask).sum((-1, -2), keepdim=True) / count
    var = ((x - mean) ** 2 * mask).sum((-1, -2), keepdim=True) / count
    return (x - mean) / torch.sqrt(var + 1e-8) * mask


def reference_update(row, table, behind, world):
    """The row's expected update from its formulas, apart from the package: for every batch
    of responses, each token's weight in the update (what multiplies grad log pi of the
    token: advantage, ratio and clip indicator, importance weight, normaliser, the KL term's
    share), and the entropy bonus's gradient, summed with the batch's probability."""
    world = world_of(row, world)  # distillation's rows: the teacher's world
    spec, n, beta = row.spec, row.batch, world.beta
    theta = table.detach().clone().requires_grad_(True)
    learner = token_logprobs(theta)
    now = learner.detach()
    before = token_logprobs(behind)
    ref = token_logprobs(world.ref)
    sampler, stored = {"current": (now, now), "behind": (before, before),
                       "lagging": (before, now)}[row.sampler]
    est = estimate(spec.kl_estimator, stored - ref) * MASK
    rewards = torch.zeros_like(MASK)
    rewards[torch.arange(len(RESPONSES)), MASK.sum(-1).long() - 1] = world.reward
    if spec.kl_in == "reward":
        rewards = rewards - beta * est
    # a lagging sampler's correction: the ratio's denominator, and each token's weight from
    # r = learner / sampler at scoring time (lab/offpolicy.py's table, written out again)
    r = torch.exp(stored - sampler)
    cap = row.cap
    old_of = {"none": stored, "clip": sampler, "decoupled": stored, "tis": stored,
              "mask": stored, "gspo": sampler}
    weight = {"none": torch.ones_like(MASK), "clip": torch.ones_like(MASK), "gspo": torch.ones_like(MASK),
              "decoupled": r.clamp(max=cap) if cap else r, "tis": r.clamp(max=cap),
              "mask": torch.where((r >= 1 / cap) & (r <= cap), r, 0.0) if cap else None}[row.correction]
    weight = torch.where(MASK.bool(), weight, 1.0)
    ratio_to = old_of[row.correction] if row.sampler == "lagging" else stored
    batches = torch.tensor(list(itertools.product(range(len(RESPONSES)), repeat=n)))
    prob = sampler.sum(-1).exp()[batches].prod(-1)                     # (G,)
    mask = MASK[batches]                                               # (G, n, N)
    R = rewards[batches]
    if spec.advantages == "preference":  # online DPO: one pair, the better of the two chosen
        total = world.reward[batches]                                  # (G, 2) the score alone
        logp = learner[batches]
        lr = ((logp.detach() - ref[batches]) * mask).sum(-1)           # (G, 2) log pi - log ref
        better = (total[:, 0] > total[:, 1]).double() - (total[:, 0] < total[:, 1]).double()
        h = better * (lr[:, 0] - lr[:, 1])                             # chosen minus rejected
        # d(-log sigmoid(beta h)) / d h = -beta sigmoid(-beta h); a tie has no pair
        pull = spec.dpo_beta * torch.sigmoid(-spec.dpo_beta * h) * (better != 0)
        coef = torch.stack([pull * better, -pull * better], -1)[..., None] * mask
        (grad,) = torch.autograd.grad((prob[:, None, None] * coef * logp).sum(), theta)
        return grad
    if spec.advantages == "distill_token":  # each token's own reward: gamma 0, no baseline
        adv = R * mask
    elif spec.advantages in ("rloo", "dr_grpo", "grpo", "distill"):
        total = R.sum(-1)                                              # (G, n)
        mean = total.mean(-1, keepdim=True)
        loo = total - (total.sum(-1, keepdim=True) - total) / (n - 1)
        adv = {"rloo": loo, "distill": loo,
               "dr_grpo": total - mean,
               "grpo": (total - mean) / (total.std(-1, keepdim=True) + 1e-4)}[spec.advantages]
        adv = adv[..., None] * mask
    elif spec.advantages == "gae":
        V = (values_under(sampler.sum(-1).exp(), rewards) if row.values == "exact"
             else arbitrary_values())[batches] * mask
        V_next = torch.cat([V[..., 1:], torch.zeros_like(V[..., :1])], -1)
        delta = (R + spec.gamma * V_next - V) * mask
        decay = spec.gamma * spec.lam
        adv = torch.stack([sum(decay ** (s - t) * delta[..., s] for s in range(t, MAX_LEN))
                           for t in range(MAX_LEN)], -1) * mask
        adv = whiten(adv, mask) if row.whiten else adv
    else:  # reinforce++: discounted returns, whitened over the batch
        returns = torch.stack([sum(spec.gamma ** (s - t) * R[..., s] for s in range(t, MAX_LEN))
                               for t in range(MAX_LEN)], -1) * mask
        adv = whiten(returns, mask)
    adv = adv * weight[batches]
    if spec.learn_tokens == "top_entropy":  # the rollout's entropy: the learner's, at ratio 1
        assert row.sampler == "current"
        cond = torch.log_softmax(table[:, 1:], -1)
        entropy = -(cond.exp() * cond).sum(-1)                          # (P,) at each prefix
        at = torch.stack([torch.stack([entropy[p] for p, _ in s] + [torch.zeros((), dtype=torch.float64)]
                                      * (MAX_LEN - len(s))) for s in STEPS])[batches]  # (G, n, N)
        for g in range(len(batches)):  # each batch's own threshold, torch.quantile's
            threshold = torch.quantile(at[g][mask[g].bool()], 1 - spec.top_entropy_quantile)
            adv[g] = adv[g] * ((at[g] >= threshold) & mask[g].bool())
    if spec.learn_tokens == "negative":  # what to avoid: the responses whose score (without
        score = world.reward[batches]    # the KL) is below their group's, with their advantage
        assert spec.advantages in GROUP_BASELINES
        adv = adv * (score < score.mean(-1, keepdim=True))[..., None]
    lengths = mask.sum(-1, keepdim=True)                               # (G, n, 1)
    share = {"token": mask / mask.sum((-1, -2), keepdim=True),
             "sequence": mask / (n * lengths),
             "budget": mask / (n * MAX_LEN)}[spec.reduction]           # each token's share
    old = ratio_to[batches]
    logp = learner[batches]
    if spec.policy_loss in ("clip_cov", "kl_cov"):
        # each batch's tokens chosen by the covariance of the learner's log-prob and the
        # advantage: KL-Cov's exactly k of the highest, ties to the earlier token in row order,
        # written out here with Python's stable sort; Clip-Cov's draw from its band, among the
        # tokens the clip has not clipped, is the package's (its hash:
        # tests/test_entropy_losses.py checks the choice by hand)
        from mingpt_rlhf.lab.entropy import clip_cov_tokens
        chosen = torch.zeros_like(adv)
        for g in range(len(batches)):
            real = mask[g].bool()
            lp, a = logp.detach()[g], adv[g]
            cov = (lp - lp[real].mean()) * (a - a[real].mean())
            k = max(1, int(spec.cov_ratio * real.sum()))
            if spec.policy_loss == "kl_cov":
                places = [tuple(ix) for ix in real.nonzero().tolist()]  # row order
                for ix in sorted(places, key=lambda ix: -cov[ix].item())[:k]:
                    chosen[g][ix] = 1.0
            else:
                ratio = torch.exp(lp - old[g])
                clipped = (((a > 0) & (ratio > 1 + spec.clip_high))
                           | ((a < 0) & (ratio < 1 - spec.clip_range)))
                chosen[g] = clip_cov_tokens(lp, a, mask[g], spec.cov_ratio, spec.clip_cov_low,
                                            spec.clip_cov_high, clipped)
    if spec.policy_loss == "kl_cov":  # no clip; coef x |log ratio| on the chosen tokens
        log_ratio = logp.detach() - old
        coef = share * (adv * log_ratio.exp() - spec.kl_cov_coef * torch.sign(log_ratio) * chosen)
    elif spec.policy_loss == "cispo":  # the ratio clipped, a constant: no token loses its gradient
        ratio = torch.exp(logp.detach() - old)
        coef = share * adv * ratio.clamp(1 - spec.clip_range, 1 + spec.clip_high)
    elif spec.policy_loss in ("token", "clip_cov"):
        if spec.policy_loss == "clip_cov":  # the chosen tokens learn nothing from the surrogate
            adv = adv * (1 - chosen)
        ratio = torch.exp(logp.detach() - old)
        clipped = ((adv > 0) & (ratio > 1 + spec.clip_high)) | ((adv < 0) & (ratio < 1 - spec.clip_range))
        coef = share * adv * ratio * ~clipped
    else:  # one ratio per response, the geometric mean of its tokens'
        a = adv.sum(-1, keepdim=True) / lengths
        s = torch.exp(((logp.detach() - old) * mask).sum(-1, keepdim=True) / lengths)
        clipped = ((a > 0) & (s > 1 + spec.clip_high)) | ((a < 0) & (s < 1 - spec.clip_range))
        coef = a * s * ~clipped / (n * lengths) * mask
    if spec.kl_in == "loss":
        coef = coef - beta * share * slope(spec.kl_estimator, logp.detach() - ref[batches])
    surrogate = (prob[:, None, None] * coef.detach() * logp).sum()
    if spec.entropy_coef:
        cond = torch.log_softmax(theta[:, 1:], -1)
        entropy = -(cond.exp() * cond).sum(-1)                          # (P,) at each prefix
        at = torch.stack([torch.stack([entropy[p] for p, _ in s] + [torch.zeros(())] * (MAX_LEN - len(s)))
                          for s in STEPS])[batches]                    # (G, n, N)
        per_token = mask / mask.sum((-1, -2), keepdim=True)            # a token mean, always
        surrogate = surrogate + spec.entropy_coef * (prob[:, None, None] * per_token * at).sum()
    (grad,) = torch.autograd.grad(surrogate, theta)
    return grad


def test_every_entry_of_every_table_has_a_row():
    """A new advantage estimator, policy loss, reduction or KL pair cannot land unchecked."""
    used = {role: {getattr(row.spec, role) for row in ROWS} for role in TABLES}
    assert set(OFFPOLICY) <= {row.correction for row in ROWS if row.sampler == "lagging"}
    for role, table in TABLES.items():
        assert set(table) <= used[role], f"{role}: no oracle row for {set(table) - used[role]}"
    pairs = {(row.spec.kl_in, row.spec.kl_estimator) for row in ROWS}
    assert pairs >= set(itertools.product(TABLES["kl_in"], TABLES["kl_estimator"]))
    assert len({row.name for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_each_row_moves_the_policy_as_its_formula_says(row):
    """The trainer's loss (losses.py through the tabular policy), in expectation over every
    batch, against each token's weight written out by hand. To float64 rounding."""
    update = expected_update(row, TABLE, WORLD, behind=BEHIND)
    expected = reference_update(row, TABLE, BEHIND, WORLD)
    assert expected.norm() > 1e-2
    torch.testing.assert_close(update, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("row", [r for r in ROWS if r.follows], ids=lambda row: row.name)
def test_a_row_with_a_closed_form_follows_it(row):
    """grad J itself (times the row's normaliser) for the unbiased rows; for the biased
    ones, the gradient of what they follow instead, derived in the functions of FOLLOWS."""
    update = expected_update(row, TABLE, WORLD, behind=BEHIND)
    torch.testing.assert_close(update, row.scale * FOLLOWS[row.follows](TABLE, world_of(row, WORLD)),
                               rtol=0, atol=1e-14)


def test_what_the_biased_kl_rows_follow_differs_from_grad_J():
    """The closed forms are not grad J in disguise: k1's semi-gradient is grad J exactly,
    the others are not; the local KLs sum to the response's KL but their gradients differ."""
    grad_j = objective_gradient(TABLE, WORLD)
    torch.testing.assert_close(semi_gradient(TABLE, WORLD, "k1"), grad_j, rtol=0, atol=1e-14)
    for name in ("semi-gradient, k2 in the reward", "semi-gradient, k3 in the reward",
                 "grad E[r]", "grad E[r] - beta x local KL(pi || ref)",
                 "grad E[r] - beta x local KL(ref || pi)"):
        assert (FOLLOWS[name](TABLE, WORLD) - grad_j).abs().max() > 1e-3, name
    pi, ref = torch.log_softmax(TABLE[:, 1:], -1), torch.log_softmax(WORLD.ref[:, 1:], -1)
    local = (visits(TABLE) * (pi.exp() * (pi - ref)).sum(-1)).sum()
    assert abs(local.item() - kl(TABLE, WORLD.ref).item()) < 1e-14   # KL = sum_p w(p) KL_p
    reverse_kl_grad = objective_gradient(TABLE, WORLD) - objective_gradient(
        TABLE, type(WORLD)(WORLD.ref, WORLD.reward, 0.0))
    assert (local_kl_gradient(TABLE, WORLD, "reverse") + reverse_kl_grad / WORLD.beta).abs().max() > 1e-3


def test_the_unbiased_rows_stop_at_pi_star_and_k1_in_the_loss_does_not_stop():
    row = next(r for r in ROWS if r.name.startswith("k1 in the reward"))
    end, steps, norm, _ = exact_ascent(row, WORLD, lr=6.0, steps=20)  # lr 1 / (beta x 1/3)
    assert norm < 1e-12 and kl(end, optimal_policy(WORLD)).item() < 1e-14
    row = next(r for r in ROWS if r.name.startswith("k1 in the loss"))
    end, steps, norm, _ = exact_ascent(row, WORLD, lr=6.0, steps=8)
    star = optimal_policy(WORLD)
    assert norm > 1e-3 and kl(end, WORLD.ref).item() > 2 * kl(star, WORLD.ref).item()


def test_both_forms_of_distillation_end_at_the_teacher():
    """On-policy distillation's two rows, followed exactly from the task's reference (the
    student's start, 0.79 nats from the teacher): both stop at the teacher itself, the task's
    pi* (the sequence form along grad -KL(pi || teacher), the token form along the per-prefix
    KL with the visits held fixed: another path, the same end)."""
    teacher = optimal_policy(WORLD)
    assert kl(WORLD.ref, teacher).item() > 0.5
    for row in (r for r in ROWS if r.world == "teacher"):
        end, steps, norm, outcome = exact_ascent(row, WORLD, lr=3.0, steps=60)
        assert outcome == "fixed point" and kl(end, teacher).item() < 1e-12, row.name


# ----------------------------------------------------------------------------- DPO, IPO, the RM


def gradient_of(fn, x):
    x = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(x), x)
    return grad


def test_dpo_is_minimised_by_pi_star_of_the_same_beta():
    """On preferences that follow Bradley-Terry with the reward r, the DPO loss's minimiser
    over every policy is pi* = ref exp(r / beta) / Z: "RLHF without RL". The loss is convex in
    the implicit reward beta log(pi / ref), so a point where its gradient is 0 is the
    minimum; perturbations only raise it."""
    star = optimal_policy(WORLD)
    assert gradient_of(lambda t: preference_loss(t, WORLD), star).abs().max() < 1e-15
    best = preference_loss(star, WORLD).item()
    gen = torch.Generator().manual_seed(2)
    for scale in (1e-3, 0.1, 1.0):
        moved = star + scale * torch.randn(star.shape, generator=gen, dtype=torch.float64)
        assert preference_loss(moved, WORLD).item() > best
    assert gradient_of(lambda t: preference_loss(t, WORLD), WORLD.ref).abs().max() > 1e-2


def test_ipo_is_minimised_by_its_own_policy_not_pi_star():
    """IPO's minimiser is ref exp(P(y wins) / beta) / Z (gradients.ipo_optimal_policy): the
    gradient vanishes there and not at pi*, which it differs from."""
    ipo = ipo_optimal_policy(WORLD)
    assert gradient_of(lambda t: preference_loss(t, WORLD, "ipo"), ipo).abs().max() < 1e-15
    star = optimal_policy(WORLD)
    assert gradient_of(lambda t: preference_loss(t, WORLD, "ipo"), star).abs().max() > 0.1
    assert kl(ipo, star).item() > 0.1
    best = preference_loss(ipo, WORLD, "ipo").item()
    gen = torch.Generator().manual_seed(3)
    for scale in (1e-3, 0.1, 1.0):
        moved = ipo + scale * torch.randn(ipo.shape, generator=gen, dtype=torch.float64)
        assert preference_loss(moved, WORLD, "ipo").item() > best


def test_the_reward_models_loss_recovers_r_up_to_a_constant():
    """The pairwise loss's gradient is 0 at the scores r (and r + c), and its Hessian there
    is positive on every direction but the constant one: r + c is the only minimiser."""
    r = WORLD.reward
    for shift in (0.0, 3.0):
        assert gradient_of(lambda s: reward_model_loss(s, WORLD), r + shift).abs().max() < 1e-15
    hessian = torch.autograd.functional.hessian(lambda s: reward_model_loss(s, WORLD), r.clone())
    eigen = torch.linalg.eigvalsh(hessian)
    assert eigen[0].abs() < 1e-15 and eigen[1] > 1e-4
    torch.testing.assert_close(hessian.sum(-1), torch.zeros_like(r), rtol=0, atol=1e-15)


def test_the_docs_table_is_the_oracles_json():
    """docs/gradients.md's table is `python -m mingpt_rlhf.lab.gradients --markdown` of the
    committed bench/results/gradients.json, and that JSON holds a row for every row of ROWS."""
    import json
    import os
    from mingpt_rlhf.lab.gradients import markdown_table
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "bench", "results", "gradients.json")) as f:
        result = json.load(f)
    assert [r["name"] for r in result["rows"]] == [row.name for row in ROWS]
    with open(os.path.join(root, "docs", "gradients.md")) as f:
        assert markdown_table(result) in f.read()
