"""Built-in tasks: where the "human" data of RLHF comes from when no humans are around.

A task gives every stage its data from one seed: SFT demonstrations (prompt, response),
preference pairs for the reward model, prompts for PPO, and a hidden *gold* reward that plays
the part of the humans' true taste. The gold reward is never used for training; it is there
so that a run can show that RLHF raised the true reward and not only the reward model's score
(a rising RM score with a flat gold reward is reward hacking: docs/results.md measures it).

The task "reviews" is a synthetic language of short movie reviews from a fixed grammar:

    review := clause (connective clause){0..3} "."         1 to 4 clauses
    clause := subject verb [intensifier] adjective          "the plot was very dull"

Adjectives carry a polarity (+1, -1 or 0) and intensifiers a strength (no intensifier: 0.8).
A prompt is the opening of a review cut right after a verb ("the plot was"); the response is
the rest ("very dull but the music sounded superb ."). The gold reward of a response is the
mean of polarity * strength over the response's adjectives, in [-1, 1], or -1 when the text
is not a review or the response did not end with "<eos>". So the best policy writes
strongly positive, grammatical reviews and stops.

Demonstrations mix positive, negative and mixed reviews in equal parts (mean gold ~0): SFT
learns the language, not the taste. The taste reaches the policy only through preference
pairs, whose labels a noisy Bradley-Terry "labeller" draws from the gold reward.

The held-out split ("eval") is fresh draws, not unseen prompts: 80 % of the prompts are one
of 50 openings ("the plot was"), so most eval prompts occur in training too, with any seed
(160 of the 200 with seed 1337). What is held out is the responses the policy writes.

Try it:  python -c "from mingpt_rlhf.tasks import get_task; t=get_task('reviews'); print(t.sft_examples('train')[:3])"

The task "sort" (task_sort.py) has an answer a program checks, and a teacher that is wrong
on 30 % of the problems: RL from the check itself (`train_ppo.py --reward task`) against
imitation.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .machinery.errors import UserError
from .task_base import BuiltinTask, PreferencePair  # noqa: F401 (PreferencePair: part of this module's API)
from .tokenizer import EOS, WordTokenizer

# ----------------------------------------------------------------------------- the grammar
SUBJECTS = ["the film", "the plot", "the acting", "the music", "the ending",
            "the cast", "the script", "the dialogue", "the pacing", "the story"]
VERBS = ["was", "felt", "seemed", "looked", "sounded"]
INTENSIFIERS = {"somewhat": 0.5, "rather": 0.7, "quite": 0.9, "very": 1.0, "truly": 1.0, "really": 1.0}
NO_INTENSIFIER = 0.8  # a bare "the plot was dull" is fairly strong, between "rather" and "quite"
ADJECTIVES = {
    **dict.fromkeys(["wonderful", "superb", "brilliant", "moving",
                     "delightful", "gripping", "charming", "excellent"], 1),
    **dict.fromkeys(["dull", "awful", "boring", "clumsy",
                     "tedious", "bland", "weak", "dreadful"], -1),
    **dict.fromkeys(["ordinary", "long", "familiar"], 0),
}
CONNECTIVES = ["and", "but", "while"]
STOP = "."
MAX_CLAUSES = 4

# every word of the language, in a fixed order so that token ids never depend on the data
VOCAB = list(dict.fromkeys(
    [w for s in SUBJECTS for w in s.split()] + VERBS + list(INTENSIFIERS)
    + list(ADJECTIVES) + CONNECTIVES + [STOP]))

_SUBJECT_WORDS = [s.split() for s in SUBJECTS]
_ADJECTIVES_BY_POLARITY = {p: [a for a, q in ADJECTIVES.items() if q == p] for p in (1, -1, 0)}

# ----------------------------------------------------------------------------- the demonstrator
MODES = ["positive", "negative", "mixed"]  # drawn uniformly, so demonstrations have mean gold ~0
NEUTRAL_PROB = 0.1     # any clause may say "ordinary", whatever the mode
INTENSIFIER_PROB = 0.5
MAX_DEMO_CLAUSES = 3   # demonstrations stop at 3 so that the 4th clause stays legal but rare
FIRST_CUT_PROB = 0.7   # most prompts are "the X verb"; the rest carry an earlier clause along


@dataclass
class _Review:
    """A review as parts, so it can be cut after any clause's verb and re-completed."""
    heads: list  # per clause: subject words + verb        ["the", "plot", "was"]
    tails: list  # per clause: [intensifier] adjective     ["very", "dull"]
    connectives: list  # connectives[k] joins clause k and clause k + 1

    def prompt_words(self, cut: int) -> list:
        """The opening up to and including the verb of clause `cut`."""
        words = []
        for k in range(cut):
            words += self.heads[k] + self.tails[k] + [self.connectives[k]]
        return words + self.heads[cut]

    def response_words(self, cut: int) -> list:
        """Everything after the verb of clause `cut`, ending with the full stop."""
        words = list(self.tails[cut])
        for k in range(cut + 1, len(self.heads)):
            words += [self.connectives[k - 1]] + self.heads[k] + self.tails[k]
        return words + [STOP]


def _sample_review(rng: random.Random, n_clauses: int) -> _Review:
    mode = rng.choice(MODES)
    heads, tails = [], []
    for subject in rng.sample(_SUBJECT_WORDS, n_clauses):  # distinct subjects read naturally
        if rng.random() < NEUTRAL_PROB:
            polarity = 0
        elif mode == "mixed":
            polarity = rng.choice([1, -1])
        else:
            polarity = 1 if mode == "positive" else -1
        adjective = rng.choice(_ADJECTIVES_BY_POLARITY[polarity])
        intensifier = [rng.choice(list(INTENSIFIERS))] if rng.random() < INTENSIFIER_PROB else []
        heads.append(subject + [rng.choice(VERBS)])
        tails.append(intensifier + [adjective])
    connectives = [rng.choice(CONNECTIVES) for _ in range(n_clauses - 1)]
    return _Review(heads, tails, connectives)


def _sample_cut(rng: random.Random, review: _Review) -> int:
    n = len(review.heads)
    return 0 if n == 1 or rng.random() < FIRST_CUT_PROB else rng.randrange(1, n)


def _complete(rng: random.Random, review: _Review, cut: int) -> list:
    """A fresh response to `review`'s prompt at `cut`: a new review that keeps the opening.

    The new review has its own sentiment mode, so two completions of one prompt often differ
    in taste (the point of a comparison). It is close to, not exactly, the demonstrations'
    distribution given the prompt (the mode ignores the prompt's adjectives).
    """
    fresh = _sample_review(rng, rng.randint(cut + 1, MAX_DEMO_CLAUSES))
    fresh.heads[:cut + 1] = review.heads[:cut + 1]
    fresh.tails[:cut] = review.tails[:cut]
    fresh.connectives[:cut] = review.connectives[:cut]
    return fresh.response_words(cut)


def _corrupt(rng: random.Random, words: list) -> list:
    """One random edit of the kind a broken generator makes (it may, rarely, stay grammatical)."""
    words = list(words)
    i = rng.randrange(len(words))
    edit = rng.choice(["drop", "duplicate", "swap", "drop_stop"])
    if edit == "drop":
        del words[i]
    elif edit == "duplicate":
        words.insert(i, words[i])
    elif edit == "swap":
        i = min(i, len(words) - 2)  # responses have >= 2 words ("dull ."), so a pair exists
        words[i], words[i + 1] = words[i + 1], words[i]
    else:  # the response never finishes its sentence
        words.pop()
    return words


def _parse(words: list) -> list | None:
    """Adjective scores [(word index, polarity * strength)] if `words` are one review, else None.

    A greedy left-to-right reading is exact here: no subject is a prefix of another, and the
    word classes (subject, verb, intensifier, adjective, connective, ".") do not overlap.
    """
    i, scores = 0, []
    while True:
        subject = next((s for s in _SUBJECT_WORDS if words[i:i + len(s)] == s), None)
        if subject is None:
            return None
        i += len(subject)
        if i >= len(words) or words[i] not in VERBS:
            return None
        i += 1
        strength = NO_INTENSIFIER
        if i < len(words) and words[i] in INTENSIFIERS:
            strength = INTENSIFIERS[words[i]]
            i += 1
        if i >= len(words) or words[i] not in ADJECTIVES:
            return None
        scores.append((i, ADJECTIVES[words[i]] * strength))
        i += 1
        if len(scores) > MAX_CLAUSES:
            return None
        if i < len(words) and words[i] in CONNECTIVES:
            i += 1
            continue
        return scores if words[i:] == [STOP] else None


class ReviewsTask(BuiltinTask):
    """Synthetic movie reviews with a hidden gold reward; see the module docstring.

    `tau` is the labeller's temperature: P(a preferred to b) = sigmoid((gold_a - gold_b) / tau).
    The share of labels that agree with the gold ordering (`gold_agreement`, ties count 0.5)
    is the best pairwise accuracy a reward model can reach. Measured on 20000 pairs for each of
    seeds 0, 1, 2 (corrupt_frac 0.1): 0.945 at tau 0.05; 0.914 at tau 0.1, the default;
    0.891 at tau 0.15; 0.870 at tau 0.2. A 1000-pair eval set adds about +-0.01 (seed 0:
    0.909). About 5% of pairs tie in gold ("very superb" vs "truly brilliant") and cap it.
    `corrupt_frac` is the share of pairs where one side is broken (not grammatical, gold -1),
    so the reward model learns that broken text is bad and PPO cannot win by breaking grammar.
    """

    name = "reviews"

    def __init__(self, seed: int = 0, n_sft_train: int = 20000, n_sft_eval: int = 500,
                 n_pairs_train: int = 8000, n_pairs_eval: int = 1000,
                 n_prompts_train: int = 2000, n_prompts_eval: int = 200,
                 tau: float = 0.1, corrupt_frac: float = 0.1):
        if not tau > 0:
            raise UserError(f"tau must be > 0 (got {tau}); try the default 0.1")
        if not 0 <= corrupt_frac <= 1:
            raise UserError(f"corrupt_frac must be in [0, 1] (got {corrupt_frac}); try the default 0.1")
        self.seed, self.tau, self.corrupt_frac = seed, tau, corrupt_frac
        self.sizes = {("sft", "train"): n_sft_train, ("sft", "eval"): n_sft_eval,
                      ("pairs", "train"): n_pairs_train, ("pairs", "eval"): n_pairs_eval,
                      ("prompts", "train"): n_prompts_train, ("prompts", "eval"): n_prompts_eval}
        self._cache = {}

    def tokenizer(self) -> WordTokenizer:
        return WordTokenizer(VOCAB)

    # ------------------------------------------------------------------------- data
    def _draw_data(self, kind: str, split: str, rng: random.Random) -> list:
        make = {"sft": self._sft_example, "pairs": self._pair,
                "prompts": lambda rng: self._sft_example(rng)[0]}[kind]
        return [make(rng) for _ in range(self.sizes[kind, split])]

    def _sft_example(self, rng: random.Random) -> tuple[str, str]:
        review = _sample_review(rng, rng.randint(1, MAX_DEMO_CLAUSES))
        cut = _sample_cut(rng, review)
        return " ".join(review.prompt_words(cut)), " ".join(review.response_words(cut))

    def _pair(self, rng: random.Random) -> PreferencePair:
        review = _sample_review(rng, rng.randint(1, MAX_DEMO_CLAUSES))
        cut = _sample_cut(rng, review)
        prompt = " ".join(review.prompt_words(cut))
        a = b = _complete(rng, review, cut)
        while b == a:  # two identical sides teach nothing (over 100 endings exist, so it ends)
            b = _complete(rng, review, cut)
        if rng.random() < self.corrupt_frac:
            # Break side b (a and b are drawn alike and the labeller orders them, so either
            # side would do). Redraw edits that stayed grammatical, e.g. a dropped "very".
            broken = b
            while self.well_formed(prompt, " ".join(broken + [EOS])):
                broken = _corrupt(rng, b)
            b = broken
        a, b = " ".join(a), " ".join(b)
        gold_a, gold_b = (self.gold_reward(prompt, text + " " + EOS) for text in (a, b))
        # Bradley-Terry labeller: close calls are often labelled the "wrong" way, as by humans.
        # P(a preferred) = sigmoid((gold_a - gold_b) / tau), written with tanh: no overflow.
        if rng.random() < 0.5 * (1.0 + math.tanh((gold_a - gold_b) / (2 * self.tau))):
            return PreferencePair(prompt, chosen=a, rejected=b)
        return PreferencePair(prompt, chosen=b, rejected=a)

    # ------------------------------------------------------------------------- gold reward
    def _response_scores(self, prompt: str, response: str) -> list | None:
        """Scores of the response's own adjectives, or None when the pair is not well formed."""
        prompt_words, response_words = prompt.split(), response.split()
        # finished means: exactly one "<eos>", as the last word
        if not response_words or response_words[-1] != EOS or EOS in response_words[:-1]:
            return None
        scores = _parse(prompt_words + response_words[:-1])
        if scores is None:
            return None
        # the prompt's adjectives were written by the user, not by the policy: ignore them
        mine = [score for i, score in scores if i >= len(prompt_words)]
        return mine or None  # a response with no adjective of its own completed nothing

    def well_formed(self, prompt: str, response: str) -> bool:
        """prompt + response is one grammatical review and the response ends with "<eos>"."""
        return self._response_scores(prompt, response) is not None

    def gold_reward(self, prompt: str, response: str) -> float:
        """The hidden true reward in [-1, 1] of a decoded response (ending with "<eos>").

        Mean of polarity * strength over the response's adjectives; -1 if not well formed.
        """
        scores = self._response_scores(prompt, response)
        return -1.0 if scores is None else sum(scores) / len(scores)


def gold_agreement(task, pairs: list[PreferencePair]) -> float:
    """Share of labels that agree with the gold ordering (ties count 0.5): the ceiling of a
    reward model's pairwise accuracy, since even the gold reward itself scores only this."""
    total = 0.0
    for pair in pairs:
        margin = (task.gold_reward(pair.prompt, pair.chosen + " " + EOS)
                  - task.gold_reward(pair.prompt, pair.rejected + " " + EOS))
        # a tolerance, because (0.9 + 0.7) / 2 and 0.8 are the same gold but not the same float
        total += 0.5 if abs(margin) < 1e-9 else float(margin > 0)
    return total / max(len(pairs), 1)


def _sort_task(**kwargs):
    from .task_sort import SortTask  # its own file; it builds on task_base.BuiltinTask
    return SortTask(**kwargs)


TASKS = {"reviews": ReviewsTask, "sort": _sort_task}


def task_of_tokenizer(tokenizer):
    """The built-in task whose vocabulary `tokenizer` is (a policy trained on it), or None."""
    from .tokenizer import same_tokenizer
    for name in TASKS:
        task = get_task(name)
        if same_tokenizer(task.tokenizer(), tokenizer):
            return task
    return None


def get_task(name: str, label_noise: float = 0.0, length_bias: float = 0.0, **kwargs):
    """The built-in task called `name`, built with `kwargs` (seed, sizes, tau, ...), its
    labeller given the faults `label_noise` and `length_bias` (task_base.labeller_faults)."""
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    task = TASKS[name](**kwargs)
    task.set_labeller(label_noise, length_bias)
    return task
