"""Properties of the built-in "reviews" task: gold reward, data, determinism, label noise."""

import pytest

from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.task_base import labeller_faults, response_length
from mingpt_rlhf.tasks import TASKS, PreferencePair, ReviewsTask, get_task, gold_agreement


@pytest.fixture(scope="module")
def task():
    return ReviewsTask(seed=0)


# ----------------------------------------------------------------------------- gold reward
@pytest.mark.parametrize("prompt, response, gold", [
    ("the film was", "very superb and the plot felt truly wonderful . <eos>", 1.0),
    ("the film was", "dull but the music sounded awful . <eos>", -0.8),
    ("the film was", "very superb but the plot was dull . <eos>", (1.0 - 0.8) / 2),
    ("the film was", "somewhat moving . <eos>", 0.5),
    ("the film was", "rather long . <eos>", 0.0),
    # the prompt's adjectives ("dreadful") are the user's words, not the policy's
    ("the film was dreadful but the cast seemed", "quite charming . <eos>", 0.9),
    # a prompt cut before the intensifier still lends its strength to the response's adjective
    ("the film was somewhat", "dull . <eos>", -0.5),
    # four clauses is the longest legal review
    ("the film was", "superb and the plot was superb and the cast was superb and the music was superb . <eos>", 0.8),
])
def test_gold_reward_of_well_formed_reviews(task, prompt, response, gold):
    assert task.well_formed(prompt, response)
    assert task.gold_reward(prompt, response) == pytest.approx(gold)


@pytest.mark.parametrize("prompt, response", [
    ("the film was", "very superb <eos>"),                        # missing "."
    ("the film was", "very very superb . <eos>"),                 # duplicated word
    ("the film was", "superb very . <eos>"),                      # swapped words
    ("the film was", ". <eos>"),                                  # no adjective
    ("the film was", "superb and . <eos>"),                       # dangling connective
    ("the film was", "superb and the plot was superb and the cast was superb"
                     " and the music was superb and the story was superb . <eos>"),  # 5 clauses
    ("the film was", "superb ."),                                 # unfinished: no <eos>
    ("the film was", "superb . <eos> superb"),                    # text after <eos>
    ("the film was", "superb . <eos> <eos>"),                     # two <eos>
    ("the film was", "superb . . <eos>"),                         # nothing may follow "."
    ("the film was", "fantastic . <eos>"),                        # not a word of the language
    ("the film was", "<unk> . <eos>"),
    ("the film was superb .", "<eos>"),                           # the response wrote nothing
    ("the film", "superb . <eos>"),                               # verb missing
    ("", ""),
])
def test_not_well_formed_gets_minus_one(task, prompt, response):
    assert not task.well_formed(prompt, response)
    assert task.gold_reward(prompt, response) == -1.0


def test_gold_reward_of_a_decoded_generation(task):
    """The policy's side: ids -> decode -> gold, with EOS decoded as the word "<eos>"."""
    tok = task.tokenizer()
    prompt = "the plot was"
    ids = tok.encode("truly gripping .") + [tok.eos_id, tok.pad_id, tok.pad_id]
    response = tok.decode(ids)
    assert response == "truly gripping . <eos>"
    assert task.gold_reward(prompt, response) == 1.0


# ----------------------------------------------------------------------------- demonstrations
def test_demonstrations_are_well_formed_with_mean_gold_near_zero(task):
    examples = task.sft_examples("train")
    assert len(examples) == 20000
    golds = []
    for prompt, response in examples:
        assert "<eos>" not in response  # the data layer appends the EOS token
        assert prompt.split()[-1] in {"was", "felt", "seemed", "looked", "sounded"}
        assert task.well_formed(prompt, response + " <eos>"), (prompt, response)
        golds.append(task.gold_reward(prompt, response + " <eos>"))
    assert all(-1.0 <= g <= 1.0 for g in golds)
    assert abs(sum(golds) / len(golds)) < 0.15
    # the taste is not in the demonstrations: they praise and pan in similar amounts
    assert 0.25 < sum(g > 0 for g in golds) / len(golds) < 0.55
    assert 0.25 < sum(g < 0 for g in golds) / len(golds) < 0.55


def test_demonstrations_round_trip_through_the_tokenizer(task):
    tok = task.tokenizer()
    for prompt, response in task.sft_examples("eval") + [(p, "") for p in task.prompts("train")]:
        text = f"{prompt} {response}".strip()
        ids = tok.encode(text)
        assert tok.unk_id not in ids and tok.pad_id not in ids and tok.eos_id not in ids
        assert tok.decode(ids) == text


def test_tokenizer_is_fixed_by_the_grammar():
    a, b = ReviewsTask(seed=0).tokenizer(), ReviewsTask(seed=5).tokenizer()
    assert a.state_dict() == b.state_dict()
    assert "." in a.stoi and "the" in a.stoi and a.vocab_size < 60


def test_each_kind_of_data_is_drawn_once_then_served_from_the_cache(monkeypatch):
    """Drawing 20,000 demonstrations takes a fraction of a second, once: every stage asks for
    them (SFT, ptx, evals), and each later call copies the cached list instead of drawing
    it again."""
    draws = []
    real = ReviewsTask._draw_data
    monkeypatch.setattr(ReviewsTask, "_draw_data",
                        lambda self, kind, split, rng: draws.append((kind, split)) or real(self, kind, split, rng))
    task = ReviewsTask(seed=123)
    first = task.sft_examples("train")
    assert len(first) == 20000 and draws == [("sft", "train")]
    for _ in range(3):
        assert task.sft_examples("train") == first
    task.sft_examples("eval")
    assert draws == [("sft", "train"), ("sft", "eval")]


# ----------------------------------------------------------------------------- determinism
def test_same_seed_same_data_other_seed_other_data(task):
    small = dict(n_sft_train=300, n_pairs_train=300, n_prompts_train=300)
    a, b, c = ReviewsTask(seed=7, **small), ReviewsTask(seed=7, **small), ReviewsTask(seed=8, **small)
    for kind in ("sft_examples", "preference_pairs", "prompts"):
        data_a = getattr(a, kind)("train")
        assert data_a == getattr(b, kind)("train")
        assert data_a == getattr(a, kind)("train")  # every call, not only the first
        assert data_a != getattr(c, kind)("train")


def test_train_and_eval_differ(task):
    assert task.sft_examples("train")[:500] != task.sft_examples("eval")
    assert task.preference_pairs("train")[:1000] != task.preference_pairs("eval")
    assert task.prompts("train")[:200] != task.prompts("eval")


def test_returned_lists_are_copies(task):
    examples = task.sft_examples("eval")
    examples.clear()
    assert len(task.sft_examples("eval")) == 500


def test_bad_split_raises(task):
    with pytest.raises(ValueError, match="split"):
        task.sft_examples("test")


# ----------------------------------------------------------------------------- preference pairs
def test_pairs_share_a_prompt_and_corrupted_sides_are_broken(task):
    pairs = task.preference_pairs("train")
    n_broken = 0
    for pair in pairs:
        assert isinstance(pair, PreferencePair)
        assert pair.chosen != pair.rejected
        sides_ok = [task.well_formed(pair.prompt, side + " <eos>") for side in (pair.chosen, pair.rejected)]
        assert sum(sides_ok) >= 1  # at most one side is corrupted
        for ok, side in zip(sides_ok, (pair.chosen, pair.rejected)):
            if not ok:
                assert task.gold_reward(pair.prompt, side + " <eos>") == -1.0
        n_broken += not all(sides_ok)
    assert 0.07 < n_broken / len(pairs) < 0.13  # corrupt_frac = 0.1


def test_no_corruption_when_corrupt_frac_is_zero():
    clean = ReviewsTask(seed=1, n_pairs_eval=500, corrupt_frac=0.0)
    for pair in clean.preference_pairs("eval"):
        assert clean.well_formed(pair.prompt, pair.chosen + " <eos>")
        assert clean.well_formed(pair.prompt, pair.rejected + " <eos>")


def test_labels_follow_gold_but_with_noise(task):
    agreement = gold_agreement(task, task.preference_pairs("eval"))
    assert 0.85 < agreement < 0.97  # more often right than wrong, but not always (tau > 0)
    noisy = ReviewsTask(seed=0, tau=1.0)
    assert gold_agreement(noisy, noisy.preference_pairs("eval")) < agreement - 0.05


def test_gold_agreement_counts_ties_as_half(task):
    pairs = [PreferencePair("the film was", "very superb .", "dull ."),      # agrees
             PreferencePair("the film was", "dull .", "very superb ."),      # disagrees
             PreferencePair("the film was", "very superb .", "truly superb .")]  # tie
    assert gold_agreement(task, pairs) == pytest.approx(0.5)


# ----------------------------------------------------------------------------- registry
def test_get_task():
    assert "reviews" in TASKS
    made = get_task("reviews", seed=3, n_prompts_eval=5)
    assert isinstance(made, ReviewsTask) and made.name == "reviews" and len(made.prompts("eval")) == 5
    with pytest.raises(UserError, match="reviews"):
        get_task("poems")


def test_bad_tau_is_a_user_error():
    with pytest.raises(UserError, match="tau"):
        ReviewsTask(tau=0)


# ---------------------------------------------------------------------------- the sort task
def test_sort_check_is_strict():
    """Exactly the sorted digits and one EOS: a checker a policy cannot game by writing two
    answers, no EOS, an extra digit, or nothing."""
    t = get_task("sort")
    p = "sort 3 1 2 1 :"
    assert t.check(p, "1 1 2 3 <eos>") and t.gold_reward(p, "1 1 2 3 <eos>") == 1.0
    for wrong in ["1 1 2 3", "1 1 3 2 <eos>", "1 1 2 3 <eos> 1 1 2 3 <eos>", "1 1 2 3 3 <eos>",
                  "<eos>", "", "1 2 3 <eos>", "1 1 2 3 . <eos>"]:
        assert t.gold_reward(p, wrong) == 0.0, wrong
    assert t.well_formed(p, "1 1 3 2 <eos>") and not t.well_formed(p, "1 1 2 <eos>")
    assert not t.check("sort x :", "<eos>") and not t.check("1 2 :", "1 2 <eos>")


def test_sort_teacher_is_wrong_on_its_share_and_held_out_problems_stay_out():
    t = get_task("sort", seed=3)
    demos = t.sft_examples("train")
    right = sum(t.check(p, r + " <eos>") for p, r in demos) / len(demos)
    assert abs(right - 0.7) < 0.02  # teacher_error 0.3 (all-equal lists cannot be wrong)
    assert all(t.well_formed(p, r + " <eos>") for p, r in demos)  # wrong, never malformed
    held_out = set(t.prompts("eval")) | {p for p, _ in t.sft_examples("eval")}
    train = {p for p, _ in demos} | set(t.prompts("train")) | {x.prompt for x in t.preference_pairs("train")}
    assert held_out and not held_out & train
    pair = t.preference_pairs("train")[0]
    assert t.check(pair.prompt, pair.chosen + " <eos>") and not t.check(pair.prompt, pair.rejected + " <eos>")
    assert get_task("sort", teacher_error=0.0).sft_examples("train")[0][1] == \
        " ".join(sorted(get_task("sort", teacher_error=0.0).sft_examples("train")[0][0].split()[1:-1]))


def test_sample_and_tasks_recognise_a_policy_by_its_vocabulary():
    from mingpt_rlhf.tasks import task_of_tokenizer
    assert task_of_tokenizer(get_task("sort").tokenizer()).name == "sort"
    assert task_of_tokenizer(get_task("reviews").tokenizer()).name == "reviews"


# ----------------------------------------------------------------------------- the labeller's faults
def _pairs(n=10000, **faults):
    return get_task("reviews", seed=0, n_pairs_train=n, **faults).preference_pairs("train")


@pytest.fixture(scope="module")
def clean_pairs():
    return _pairs()


def test_label_noise_flips_its_share_of_labels_and_nothing_else(clean_pairs):
    """On 10,000 pairs the share of labels --label_noise 0.25 swaps is 0.25 within 0.01 (the
    binomial's std is 0.0043); every pair keeps its prompt and its two responses."""
    noisy = _pairs(label_noise=0.25)
    assert [(p.prompt, {p.chosen, p.rejected}) for p in noisy] == \
        [(p.prompt, {p.chosen, p.rejected}) for p in clean_pairs]
    flipped = sum(a.chosen != b.chosen for a, b in zip(clean_pairs, noisy)) / len(noisy)
    assert flipped == pytest.approx(0.25, abs=0.01)
    # a pair flipped at 0.1 is flipped at 0.25 too: the draws are shared between settings
    less = _pairs(label_noise=0.1)
    assert all(b.chosen != a.chosen for a, b, c in zip(clean_pairs, noisy, less) if c.chosen != a.chosen)


def test_length_bias_turns_its_share_of_the_labels_it_can_turn(clean_pairs):
    """--length_bias 0.3: of the pairs whose own label chose the shorter response (4,174 of
    10,000 here; the estimate's std is 0.007), 0.3 within 0.01 now choose the longer; a label
    that already chose the longer, or two responses of one length, is never changed."""
    biased = _pairs(length_bias=0.3)
    turned = [b.chosen != a.chosen for a, b in zip(clean_pairs, biased)
              if response_length(a.chosen) < response_length(a.rejected)]
    assert len(turned) > 4000
    assert sum(turned) / len(turned) == pytest.approx(0.3, abs=0.01)
    assert all(a == b for a, b in zip(clean_pairs, biased)
               if response_length(a.chosen) >= response_length(a.rejected))
    # and with it the labels prefer length: the longer side is chosen more often than before
    longer = [sum(response_length(p.chosen) > response_length(p.rejected) for p in ps)
              for ps in (clean_pairs, biased)]
    assert longer[1] > longer[0]


def test_labeller_faults_by_hand():
    """The rule on drawn numbers: u < a turns a shorter choice to the longer, then v < p flips."""
    class Draws:  # rng.random() returns these in order: (u, v) per pair
        def __init__(self, values):
            self.values = iter(values)

        def random(self):
            return next(self.values)
    pair = PreferencePair("p", chosen="dull .", rejected="very dull and the plot was bland .")
    same = labeller_faults([pair], 0.0, 0.5, Draws([0.6, 0.9]))[0]
    assert same == pair                                               # u >= a: its own label
    longer = labeller_faults([pair], 0.0, 0.5, Draws([0.4, 0.9]))[0]
    assert longer.chosen == pair.rejected                             # u < a: the longer
    both = labeller_faults([pair], 0.3, 0.5, Draws([0.4, 0.2]))[0]
    assert both == pair                                               # then v < p flips it back


def test_the_gold_and_the_clean_labels_do_not_move_with_the_faults(clean_pairs):
    task = get_task("reviews", seed=0, label_noise=0.25, length_bias=0.5)
    assert task.gold_reward("the film was", "very superb . <eos>") == 1.0
    assert _pairs(n=10000, label_noise=0.0, length_bias=0.0) == clean_pairs


@pytest.mark.parametrize("faults, needle", [(dict(label_noise=0.6), "label_noise"),
                                            (dict(label_noise=-0.1), "label_noise"),
                                            (dict(length_bias=1.5), "length_bias"),
                                            (dict(length_bias=-1), "length_bias")])
def test_impossible_faults_are_user_errors(faults, needle):
    with pytest.raises(UserError, match=needle):
        get_task("reviews", **faults)


@pytest.mark.parametrize("argv, needle", [(["--label_noise", "0.7"], "--label_noise"),
                                          (["--length_bias", "-0.2"], "--length_bias"),
                                          (["--label_noise", "0.1", "--data", "prefs.jsonl"],
                                           "drop them")])
def test_train_rm_refuses_impossible_faults_with_exit_2(argv, needle, capsys, tmp_path):
    from conftest import exits_2
    line = exits_2(capsys, "train_rm", argv + ["--out_dir", str(tmp_path)])
    assert needle in line
