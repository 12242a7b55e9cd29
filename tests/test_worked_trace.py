"""docs/worked_iteration.md is what bench/worked_trace.py writes: the page's numbers are the
trainer's, so a change to PPO's math (or an edit of the page) fails here. Regenerate the page
with `python bench/worked_trace.py` after a change to the math that is meant."""
import os

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
