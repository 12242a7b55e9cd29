"""Data: the SFT loss mask, truncation, JSONL validation, HH splitting, the word tokenizer."""
import pytest

from mingpt_rlhf.data import (IGNORE, SFTData, encode_example, load_preference_jsonl,
                              load_sft_jsonl, split_dialogue_pair)
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.tokenizer import WordTokenizer

TOK = WordTokenizer("a b c d e f".split())


def ids(text):
    return TOK.encode(text)


def test_loss_mask_covers_response_tokens_and_eos_only():
    data = SFTData(TOK, [("a b c", "d e"), ("a", "f")], block_size=16)
    inputs, targets = data.batch([0, 1])
    # row 0: tokens a b c d e <eos>; inputs drop the last, targets drop the first
    assert inputs[0].tolist() == ids("a b c d e")
    assert targets[0].tolist() == [IGNORE, IGNORE] + ids("d e") + [TOK.eos_id]
    # row 1 is shorter: its padding is ignored too
    assert targets[1].tolist() == ids("f") + [TOK.eos_id] + [IGNORE] * 3
    with_prompt = SFTData(TOK, [("a b c", "d e")], 16, loss_on_prompt=True).batch([0])[1]
    assert with_prompt[0].tolist() == ids("b c d e") + [TOK.eos_id]


def test_text_only_lines_train_on_every_token(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "a b c"}\n\n{"prompt": "a", "response": "b"}\n')
    pairs = load_sft_jsonl(str(f))
    assert pairs == [("", "a b c"), ("a", "b")]
    targets = SFTData(TOK, pairs[:1], 16).batch([0])[1]
    assert targets[0].tolist() == ids("b c") + [TOK.eos_id]


def test_truncation_cuts_the_left_of_the_prompt():
    seq, n_prompt = encode_example(TOK, "a b c d e f", "a b", block_size=6)
    assert seq == ids("d e f a b") + [TOK.eos_id] and n_prompt == 3
    assert encode_example(TOK, "a", "a b c d e f", block_size=6) is None  # response cannot fit


@pytest.mark.parametrize("content,needle", [
    ('{"prompt": "a", "response": "b"}\nnot json\n', ":2: not valid JSON"),
    ('["a list"]\n', ":1: expected a JSON object"),
    ('{"prompt": "a", "response": 3}\n', ":1: expected"),
    ("\n\n", "has no examples"),
])
def test_malformed_lines_name_file_and_line(tmp_path, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(UserError, match=f"{f}.*" if ":" in needle else needle) as e:
        load_sft_jsonl(str(f))
    assert needle in str(e.value)


def test_a_file_that_is_not_utf8_is_a_user_error_not_a_traceback(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes('{"prompt": "caf\u00e9", "response": "b"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):  # was a raw UnicodeDecodeError
        load_sft_jsonl(str(f))


def test_line_separator_characters_inside_strings_stay_in_their_line(tmp_path):
    f = tmp_path / "ls.jsonl"
    f.write_text('{"prompt": "a\u2028b", "response": "c"}\n', encoding="utf-8")
    assert load_sft_jsonl(str(f)) == [("a\u2028b", "c")]


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_sft_jsonl(str(tmp_path / "nope.jsonl"))


def test_raw_hh_pairs_are_split_at_the_last_assistant_turn(tmp_path):
    dialogue = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: a joke?\n\nAssistant:"
    pair = split_dialogue_pair(dialogue + " Why did the", dialogue + " No.")
    assert pair.prompt == dialogue and pair.chosen == " Why did the" and pair.rejected == " No."
    assert split_dialogue_pair("abc", "abd").prompt == ""  # no marker: compare whole texts
    f = tmp_path / "hh.jsonl"
    f.write_text('{"chosen": "Human: q Assistant: yes", "rejected": "Human: q Assistant: no"}\n')
    assert load_preference_jsonl(str(f))[0].prompt == "Human: q Assistant:"


def test_word_tokenizer_round_trip_and_distinct_specials():
    text = "a b c <eos>"
    assert TOK.decode(TOK.encode(text)) == text
    assert len({TOK.pad_id, TOK.eos_id, TOK.unk_id}) == 3
    assert TOK.decode([TOK.pad_id] + ids("a b")) == "a b"  # padding is layout, not text
    assert TOK.encode("zzz") == [TOK.unk_id]
