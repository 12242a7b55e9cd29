"""GPT-2 byte-level BPE on a vocabulary and merges written by the test: rank-order merging,
GPT-2's pre-tokenisation, special ids, round trips on awkward text, saving and loading."""
import itertools
import json
import random
import unicodedata

import pytest

from mingpt_rlhf.machinery.bpe import EOT, BPETokenizer, byte_to_unicode, gpt2_pattern
from mingpt_rlhf.machinery.errors import UserError

B2U = byte_to_unicode()
WORDS = ["the", " the", " and", " of", "ing", " token", " it", "'s", " 123", "  ", "\n\n",
         " café", " 東京", " don", "'t", " 😀", " x²", "ab", "abc", "Hello", " world"]
AWKWARD = [
    "", " ", "\n", "Hello world", "  two leading", "trailing   ", "multiple   spaces\tand\ttabs",
    "new\nlines\n\n\nand\r\nCRLF \n  \n", "emoji 😀👍🏽 and a family 👨‍👩‍👧 !", "naïve café résumé Ångström",
    "digits 12345 3.14 1,000,000 x² ½ Ⅻ ٣٤ ４２", "it's don't we'll they're I've I'm he'd IT'S DON'T",
    "mixed 東京は晴れ Ελληνικά русский עברית", "a<|endoftext|>b", "<|endoftext|><|endoftext|> x ",
    "symbols !!! ??? ... --- $$$ @#% ''' \"q\"", "nbsp\u00a0and\u2003em space", "zero\u200bwidth",
    "combining e\u0301 and n\u0303", "\x00\x01\x1c control", "ﬁ ligature", "under_score snake_case",
    "'s at start", "end with '", "tab\t\tthen  \t mixed", "   \n", "x\u3000ideographic space",
]


def spell(text):
    return "".join(B2U[b] for b in text.encode("utf-8"))


def make_files(tmp_path, extra_merges=()):
    """vocab.json / merges.txt: 256 byte symbols, merges that build each word in WORDS from the
    left (plus `extra_merges` first), then <|endoftext|> - the layout of GPT-2's files."""
    merges = list(extra_merges)
    for word in WORDS:
        s = spell(word)
        merges += [(s[:i], s[i]) for i in range(1, len(s))]
    merges = list(dict.fromkeys(merges))  # drop repeats, keep rank order
    tokens = list(dict.fromkeys([*B2U.values(), *(a + b for a, b in merges)]))
    encoder = {t: i for i, t in enumerate(tokens)}
    encoder[EOT] = len(encoder)
    (tmp_path / "vocab.json").write_text(json.dumps(encoder, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (tmp_path / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


@pytest.fixture
def tok(tmp_path):
    return BPETokenizer.from_pretrained(str(make_files(tmp_path)))


def test_byte_table_is_gpt2s():
    assert len(set(B2U.values())) == 256
    assert B2U[ord("A")] == "A" and B2U[ord(" ")] == "Ġ" and B2U[ord("\n")] == "Ċ"
    assert B2U[0] == "Ā" and B2U[0xAD] == "Ń" and B2U[0xFF] == "ÿ"


def test_merges_apply_in_rank_order_not_left_to_right():
    encoder = {t: i for i, t in enumerate([*B2U.values(), "bc", "ab", "aa", EOT])}
    tok = BPETokenizer(encoder, [("b", "c"), ("a", "b"), ("a", "a")])
    # greedy left to right would give "ab" + "c"; rank 0 ("b c") must win
    assert tok.bpe("abc") == ["a", "bc"]
    assert tok.bpe("abab") == ["ab", "ab"]
    assert tok.bpe("aaa") == ["aa", "a"]  # every occurrence, scanned left to right
    assert tok.encode("abc") == [encoder["a"], encoder["bc"]]


def test_pretokenisation_follows_gpt2():
    split = gpt2_pattern().findall
    assert split("Hello  world's 123abc\n\n x") == \
        ["Hello", " ", " world", "'s", " 123", "abc", "\n\n", " x"]
    assert split("a   b") == ["a", "  ", " b"]
    assert split("x²½ 東京!? \t") == ["x", "²½", " 東京", "!?", " \t"]
    assert split("e\u0301") == ["e", "\u0301"]  # combining marks are not letters in GPT-2


def test_round_trip_on_awkward_text(tok):
    for text in AWKWARD:
        assert tok.decode(tok.encode(text)) == text, text
    rng = random.Random(0)
    alphabet = "ab 1\n\t'sé😀東²_!\u00a0"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert tok.decode(tok.encode(text)) == text


def test_known_words_become_single_tokens(tok):
    assert tok.encode("the and") == [tok.encoder["the"], tok.encoder[spell(" and")]]
    # "t h" and "th e" (from "the") outrank "Ġ t", so " the" never reaches its own token
    assert tok.encode(" the") == [tok.encoder["Ġ"], tok.encoder["the"]]


def test_endoftext_is_one_id_and_pad_is_distinct(tok):
    ids = tok.encode("a<|endoftext|>b")
    assert ids == [tok.encoder["a"], tok.eos_id, tok.encoder["b"]]
    assert tok.eos_id == tok.encoder[EOT] and tok.pad_id == len(tok.encoder) != tok.eos_id
    assert tok.vocab_size == len(tok.encoder) + 1
    assert tok.decode([tok.pad_id, *ids, tok.pad_id]) == "a<|endoftext|>b"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_state_dict_round_trip(tok):
    from mingpt_rlhf.tokenizer import same_tokenizer, tokenizer_from_state
    state = json.loads(json.dumps(tok.state_dict()))  # must survive JSON
    again = tokenizer_from_state(state)
    assert isinstance(again, BPETokenizer) and same_tokenizer(tok, again)
    for text in AWKWARD:
        assert again.encode(text) == tok.encode(text)


def test_bad_files_are_user_errors(tmp_path):
    make_files(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="missing tokenizer file"):
        BPETokenizer.from_pretrained(str(tmp_path / "empty"))
    with open(tmp_path / "merges.txt", "a", encoding="utf-8") as f:
        f.write("only_one_token\n")
    with pytest.raises(UserError, match=r"merges.txt:\d+: expected two tokens"):
        BPETokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "vocab.json").write_text('{"a": 0', encoding="utf-8")
    with pytest.raises(UserError, match="cannot parse"):
        BPETokenizer.from_pretrained(str(tmp_path))
    with pytest.raises(UserError, match="no '<|endoftext|>'"):
        BPETokenizer({"a": 0}, [])


def test_stdlib_pattern_matches_regex_module_on_every_code_point():
    regex = pytest.importorskip("regex")
    gpt2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    # every code point assigned in Python's Unicode database, each between neighbours of other
    # classes (letter, number, space, symbol), so a code point put in the wrong class changes
    # where a word ends
    assigned = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    for left in "a1 !":
        text = "".join(left + c for c in assigned)
        assert gpt2_pattern().findall(text) == gpt2.findall(text)


def test_ids_match_huggingface_gpt2_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = make_files(tmp_path, extra_merges=[("b", "c"), ("a", "b")])
    ours = BPETokenizer.from_pretrained(str(folder))
    hf = transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    rng = random.Random(1)
    pieces = [w for text in AWKWARD for w in text.split(" ")] + WORDS
    fuzz = [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    for text in itertools.chain(AWKWARD, fuzz):
        assert ours.encode(text) == hf.encode(text), repr(text)


def test_published_gpt2_ids_when_cached():
    """Runs only where GPT-2's own vocab.json / merges.txt are in the cache (no download);
    the expected ids are those of OpenAI's tokenizer for the same strings."""
    import os
    from mingpt_rlhf.machinery.pretrained import cache_dir
    folder = os.path.join(cache_dir(), "gpt2")
    if not all(os.path.isfile(os.path.join(folder, f)) for f in ("vocab.json", "merges.txt")):
        pytest.skip(f"GPT-2 tokenizer files not cached in {folder}")
    tok = BPETokenizer.from_pretrained(folder)
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (50256, 50257, 50258)
    assert tok.encode("Hello world") == [15496, 995] and tok.encode(" the") == [262]
    text = "It's 2024 \u2014 na\u00efve caf\u00e9 \U0001F600\n\n  x<|endoftext|>"
    assert tok.encode(text) == [1026, 338, 48609, 851, 41492, 40304, 30325, 222, 628, 220, 2124, 50256]


def test_from_name_fetches_only_the_tokenizer_files(tmp_path, monkeypatch):
    import io
    (tmp_path / "src").mkdir()
    src = make_files(tmp_path / "src")
    monkeypatch.setenv("MINGPT_RLHF_CACHE", str(tmp_path / "cache"))
    fetched = []

    def urlopen(url, timeout=None):
        fetched.append(url.rsplit("/", 1)[1])
        response = io.BytesIO((src / fetched[-1]).read_bytes())
        response.headers = {}  # no Content-Length: the size check is skipped
        return response
    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    tok = BPETokenizer.from_pretrained("gpt2-medium")
    assert sorted(fetched) == ["merges.txt", "vocab.json"]
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
