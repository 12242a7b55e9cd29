"""The enumerable world: a policy so small that every response and its probability can be listed.

- **the world**: a vocabulary of two words (A, B) and EOS; a response is at most `MAX_LEN`
  tokens, ended by EOS or cut off after `MAX_LEN` words: 15 responses in all. The prompt is
  one fixed token. `TabularPolicy` has one learnable logit vector per prefix of the response
  (7 prefixes), behind the interface the trainer calls (`trunk`, `logits`,
  `forward(idx, attention_mask)` -> (B, T, V) logits), so the package's own log-prob code
  scores it. A reference policy (random logits) and a reward r(y) (random in [-1, 1])
  complete the world (`make_world`).
- **the objective** every RLHF method claims to maximise, J = E_pi[r] - beta KL(pi || ref),
  its gradient by autograd through the listed sum, and its maximiser in closed form,
  pi*(y) = ref(y) exp(r(y) / beta) / Z, with J(pi*) = beta log Z.
- **preferences**: pairs of responses drawn from the reference, the first preferred with the
  Bradley-Terry probability sigmoid(r_i - r_j); the expected DPO and IPO losses of a policy
  and the reward model's expected pairwise loss, each from the package's own loss of a
  pair; IPO's minimiser in closed form.

Everything is float64, and an expectation is a finite sum, so "equal" means equal to
rounding. lab/gradients.py builds the oracle on it; tests/test_gradients.py checks both.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn as nn

from ..methods.dpo import dpo_loss, response_logprob_sums
from ..heads import pairwise_loss

PAD, EOS, A, B = 0, 1, 2, 3       # token ids; PAD only fills the columns after a response
WORDS = (A, B)
VOCAB = 4
MAX_LEN = 3                        # the generation budget (max_new_tokens)
PROMPT = EOS                       # the one-token prompt (GPT-2 opens a text with its EOS)

# every prefix at which the policy chooses a token: 0, 1 or 2 words (7 of them)
PREFIXES = [p for n in range(MAX_LEN) for p in itertools.product(WORDS, repeat=n)]
PREFIX_INDEX = {p: i for i, p in enumerate(PREFIXES)}
DEAD = len(PREFIXES)               # a position past the end of the response: nothing to choose
# every response: up to MAX_LEN - 1 words then EOS, or MAX_LEN words cut off (no EOS)
RESPONSES = ([p + (EOS,) for p in PREFIXES]
             + list(itertools.product(WORDS, repeat=MAX_LEN)))


def response_batch(responses=RESPONSES):
    """(sequences (Y, 1 + MAX_LEN), attention_mask (Y, 1 + MAX_LEN), action_mask (Y, MAX_LEN)):
    the prompt token, then each response right-padded with PAD, as the sampler returns them."""
    rows = [[PROMPT, *y] + [PAD] * (MAX_LEN - len(y)) for y in responses]
    sequences = torch.tensor(rows)
    action_mask = (sequences[:, 1:] != PAD).double()
    attention_mask = torch.cat([torch.ones(len(rows), 1), action_mask], 1).long()
    return sequences, attention_mask, action_mask


class TabularPolicy(nn.Module):
    """A policy with one free logit vector per prefix of the response: every distribution over
    RESPONSES is one of its settings. Its "hidden state" at a position is the one-hot code of
    the prefix written so far, and the output layer is the table, so `logprobs.lm_logprobs`
    and the trainer's slicing (hidden[:, T-1:-1] scores the response) apply unchanged."""

    def __init__(self, logits: torch.Tensor | None = None):
        super().__init__()
        table = torch.zeros(len(PREFIXES), VOCAB, dtype=torch.float64) if logits is None else logits
        self.table = nn.Parameter(table.detach().clone().double())
        self.config = SimpleNamespace(vocab_size=VOCAB)  # what lm_logprobs reads

    def trunk(self, idx: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, T) tokens -> (B, T, P + 1) one-hot code of the response prefix ending at each
        position (the prompt is position 0; a position past EOS or the budget is DEAD)."""
        codes = []
        for row in idx.tolist():
            response = row[1:]
            codes.append([PREFIX_INDEX.get(tuple(response[:t]), DEAD) for t in range(len(row))])
        return torch.nn.functional.one_hot(torch.tensor(codes), DEAD + 1).double()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., P + 1) codes -> (..., V) logits; a DEAD position gets zeros (it is masked)."""
        return hidden[..., :DEAD] @ self.table

    def forward(self, idx: torch.Tensor, attention_mask=None) -> torch.Tensor:
        return self.logits(self.trunk(idx, attention_mask))  # (B, T, V)

    @classmethod
    def of(cls, table: torch.Tensor) -> "TabularPolicy":
        """A policy whose table *is* `table` (not a copy), so autograd reaches it."""
        policy = cls()
        del policy.table
        policy.table = table
        return policy


# ----------------------------------------------------------------------------- the world
@dataclass
class World:
    ref: torch.Tensor      # (P, V) the reference policy's logits
    reward: torch.Tensor   # (Y,) r(y) of each response of RESPONSES
    beta: float            # the KL coefficient of J


def make_world(seed: int = 0, beta: float = 0.5) -> World:
    """A reference with random logits (N(0, 1)) and rewards drawn uniformly in [-1, 1]."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(len(PREFIXES), VOCAB, generator=gen, dtype=torch.float64)
    reward = torch.rand(len(RESPONSES), generator=gen, dtype=torch.float64) * 2 - 1
    return World(ref, reward, beta)


# the (prefix index, token) of each response's choices, for the direct computation below
CHOICES = [[(PREFIX_INDEX[y[:t]], tok) for t, tok in enumerate(y)] for y in RESPONSES]


def conditionals(table: torch.Tensor) -> torch.Tensor:
    """(P, V) log pi(token | prefix), PAD excluded (the trainer never lets the policy write it)."""
    logp = torch.log_softmax(table[:, 1:], -1)
    return torch.cat([torch.full_like(table[:, :1], -math.inf), logp], 1)


def response_logprobs(table: torch.Tensor) -> torch.Tensor:
    """(Y,) log pi(y) of every response, straight from the table: the sum of its choices'
    conditional log-probs. Independent of the package's log-prob code, which tests compare."""
    cond = conditionals(table)
    return torch.stack([sum(cond[p, tok] for p, tok in choices) for choices in CHOICES])


def kl(table: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(pi || other) over whole responses, in nats."""
    logp, logq = response_logprobs(table), response_logprobs(other)
    return (logp.exp() * (logp - logq)).sum()


def objective(table: torch.Tensor, world: World) -> torch.Tensor:
    """J = E_pi[r] - beta KL(pi || ref), summed over every response."""
    logp = response_logprobs(table)
    return (logp.exp() * world.reward).sum() - world.beta * kl(table, world.ref)


def objective_gradient(table: torch.Tensor, world: World) -> torch.Tensor:
    """(P, V) grad J by autograd through the listed sum (0 in the PAD column)."""
    theta = table.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(theta, world), theta)
    return grad


def table_of(probs: torch.Tensor) -> torch.Tensor:
    """(P, V) logits of the tabular policy whose response distribution is `probs` (Y,): at each
    prefix, the probability of each next token is the mass of the responses that continue
    with it, over the mass of the responses through the prefix."""
    mass = {}
    for y, p in zip(RESPONSES, probs):
        for t in range(len(y) + 1):
            mass[y[:t]] = mass.get(y[:t], 0.0) + p
    table = torch.zeros(len(PREFIXES), VOCAB, dtype=torch.float64)
    for i, prefix in enumerate(PREFIXES):
        for tok in (EOS, *WORDS):
            table[i, tok] = torch.log(mass[prefix + (tok,)] / mass[prefix])
    return table


def optimal_policy(world: World) -> torch.Tensor:
    """(P, V) logits of pi* = ref exp(r / beta) / Z, the maximiser of J."""
    logits = response_logprobs(world.ref) + world.reward / world.beta
    return table_of(torch.softmax(logits, 0))


def optimal_value(world: World) -> float:
    """J(pi*) = beta log E_ref[exp(r / beta)]."""
    logz = torch.logsumexp(response_logprobs(world.ref) + world.reward / world.beta, 0)
    return world.beta * logz.item()


def visits(table: torch.Tensor) -> torch.Tensor:
    """(P,) the probability that a response reaches each prefix (and chooses a token there)."""
    cond = conditionals(table).exp()
    return torch.stack([torch.prod(torch.stack([cond[PREFIX_INDEX[p[:t]], p[t]]
                                                for t in range(len(p))]))
                        if p else torch.ones((), dtype=table.dtype) for p in PREFIXES])


# ----------------------------------------------------------------------------- preferences
def preference_pairs(world: World):
    """Every ordered pair (i, j) of responses and its weight in the enumerated preference
    data: both drawn from the reference, i preferred to j with the Bradley-Terry probability
    sigmoid(r_i - r_j). (chosen (M,), rejected (M,), weight (M,)); the weights sum to 1/2
    over ordered pairs, each draw being counted once, its winner first."""
    q = response_logprobs(world.ref).exp()
    i, j = torch.cartesian_prod(torch.arange(len(RESPONSES)), torch.arange(len(RESPONSES))).T
    return i, j, q[i] * q[j] * torch.sigmoid(world.reward[i] - world.reward[j])


def preference_loss(table: torch.Tensor, world: World, loss: str = "sigmoid") -> torch.Tensor:
    """The expected DPO (or IPO) loss of the tabular policy over the enumerated preferences,
    with methods/dpo.py's own loss of each pair and beta = world.beta, from log-probs summed by
    dpo.response_logprob_sums."""
    sequences, attention_mask, _ = response_batch()
    response_mask = attention_mask.clone()
    response_mask[:, 0] = 0                                            # the prompt is context
    policy = response_logprob_sums(TabularPolicy.of(table), sequences, attention_mask,
                                   response_mask, suppress=PAD)
    with torch.no_grad():
        ref = response_logprob_sums(TabularPolicy(world.ref), sequences, attention_mask,
                                    response_mask, suppress=PAD)
    i, j, weight = preference_pairs(world)

    def one(pc, pr, rc, rr):
        return dpo_loss(pc[None], pr[None], rc[None], rr[None], world.beta, loss)[0]
    return (weight * torch.vmap(one)(policy[i], policy[j], ref[i], ref[j])).sum()


def ipo_optimal_policy(world: World) -> torch.Tensor:
    """(P, V) logits of IPO's minimiser: pi(y) proportional to ref(y) exp(P(y) / beta), with
    P(y) = E_{y' ~ ref}[sigmoid(r(y) - r(y'))] the probability that y wins against a
    response of the reference. IPO regresses each pair's log-ratio gap to 1 / (2 beta) times
    the sign of the label; in expectation the gap it fits is (2 P(y wins) - 1) / (2 beta),
    so a policy keeps the reference's mass up to a factor bounded by e^(1 / beta), however
    large the reward gap (where DPO's pi* would follow r / beta without bound)."""
    q = response_logprobs(world.ref).exp()
    wins = (torch.sigmoid(world.reward[:, None] - world.reward[None, :]) * q[None, :]).sum(-1)
    return table_of(torch.softmax(response_logprobs(world.ref) + wins / world.beta, 0))


def reward_model_loss(scores: torch.Tensor, world: World) -> torch.Tensor:
    """The expected pairwise loss (heads.pairwise_loss) of a table of scores, one per
    response, over the enumerated preferences."""
    i, j, weight = preference_pairs(world)
    per_pair = torch.vmap(lambda c, r: pairwise_loss(c[None], r[None]))(scores[i], scores[j])
    return (weight * per_pair).sum()
