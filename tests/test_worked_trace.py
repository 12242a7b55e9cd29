"""docs/worked_iteration.md is what bench/worked_trace.py writes: the page's numbers are the
trainer's, so a change to PPO's math (or an edit of the page) fails here. Regenerate the page
with `python bench/worked_trace.py` after a change to the math that is meant."""
import dataclasses

import pytest

from conftest import bench_module


@pytest.fixture(scope="module")
def trace():
    b = bench_module("worked_trace")
    return b, b.page()


def test_the_page_is_what_the_trainers_functions_give(trace):
    b, text = trace
    with open(b.PAGE, encoding="utf-8") as f:
        on_disk = f.read()
    assert on_disk == text, ("docs/worked_iteration.md differs from what the trainer's functions "
                             "give: run python bench/worked_trace.py (and read the diff)")


def test_check_fails_on_an_edited_page(trace, tmp_path, monkeypatch):
    b, text = trace
    edited = tmp_path / "worked_iteration.md"
    edited.write_text(text.replace("|", "| ", 1), encoding="utf-8")
    monkeypatch.setattr(b, "PAGE", str(edited))
    monkeypatch.setattr(b, "page", lambda: text)
    assert b.main(["--check"]) == 1
    edited.write_text(text, encoding="utf-8")
    assert b.main(["--check"]) == 0


def test_the_page_traces_the_default_iteration():
    """The page's options are train_ppo.py's defaults but for the sizes and the actor's rate,
    and its trainer takes the default's parts: a separate critic, the ptx loss, the adaptive
    KL controller, the early stop at the default target_kl."""
    b = bench_module("worked_trace")
    cfg, base = b.options(), b.defaults()
    changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(base, f.name)}
    assert changed == {"rollout_batch_size", "max_new_tokens", "minibatch_size", "actor_lr"}
    assert b.trainer_is_the_default(b.build(cfg))


def test_the_trace_stops_on_a_critic_that_does_not_start_from_the_reward_model(monkeypatch):
    """The page says the critic's first values are the reward model's scores of each prefix;
    a critic whose head starts from zero (the shared head's start) parts from that claim."""
    b = bench_module("worked_trace")
    load = b.Critic.load_trunk_and_head

    def trunk_only(self, state_dict, where):
        load(self, state_dict, where)
        self.head.weight.data.zero_()
        self.head.bias.data.zero_()
    monkeypatch.setattr(b.Critic, "load_trunk_and_head", trunk_only)
    with pytest.raises(SystemExit, match="the critic's first values"):
        b.page()
