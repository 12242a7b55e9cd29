"""Today's families' tokenizers (a tokenizer.json) read by our own code: the ids of the
`tokenizers` library on the fixtures bench/tokenizer_parity.py wrote (each family's pipeline,
trained on real text), round trips over every assigned code point, the ids chosen for EOS, PAD
and BOS, the checkpoint state, and every step we do not implement refused with one line."""
import json
import os
import shutil
import unicodedata

import pytest

from mingpt_rlhf.machinery.bpe import BPETokenizer, stdlib_regex
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.tokenizer import same_tokenizer, tokenizer_from_state

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tokenizers")
FAMILIES = ["qwen2.5", "qwen3", "llama3", "smollm2", "gpt2", "options"]
# the family's EOS, BOS (or None), chat format and default system message, as its files say
CHOSEN = {
    "qwen2.5": ("<|im_end|>", None, "chatml", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    "qwen3": ("<|im_end|>", None, "qwen3", None),
    "llama3": ("<|eot_id|>", "<|begin_of_text|>", "llama3", None),
    "smollm2": ("<|im_end|>", None, "chatml", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    "gpt2": ("<|endoftext|>", None, "plain", None),
}


def load(family):
    return BPETokenizer.from_pretrained(os.path.join(FIXTURES, family))


def expected(family):
    with open(os.path.join(FIXTURES, family, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


def assigned_code_points(every=True):
    """Python's assigned code points (no surrogates); without `every`, the private-use planes
    (U+F0000 on, 131,068 code points all alike) are left out."""
    return [chr(c) for c in range(0x110000 if every else 0xF0000)
            if unicodedata.category(chr(c)) not in ("Cn", "Cs")]


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_equal_the_tokenizers_library(family):
    """Hand-made strings (emoji, ZWJ, CJK, Arabic, combining accents, digit runs, whitespace,
    CRLF, capital contractions, control characters, special tokens in text, "") and real text:
    every id equal; with the post-processor, ours with BOS in front."""
    tok, exp = load(family), expected(family)
    assert len(exp["texts"]) >= 70 and "" in exp["texts"]
    for text, ids in zip(exp["texts"], exp["ids"]):
        assert tok.encode(text) == ids, repr(text)
    bos = [tok.bos_id] if tok.bos_id is not None else []
    for text, ids in zip(exp["texts"], exp["with_post_processor"]):
        assert bos + tok.encode(text) == ids, repr(text)


@pytest.mark.parametrize("family", FAMILIES[:-1])
def test_decode_gives_the_text_back(family):
    tok, exp = load(family), expected(family)
    for text in exp["texts"]:
        want = unicodedata.normalize("NFC", text) if tok.nfc else text
        assert tok.decode(tok.encode(text)) == want, repr(text)


def test_added_token_options_as_the_tokenizers_library_reads_them():
    """The options fixture: the longest added token wins; lstrip / rstrip take the white space
    beside a token into it; a normalized token matches the NFC text (e + U+0301 is é)."""
    tok = load("options")
    ids = {t.content: t.id for t in tok.added}
    assert tok.encode("<|a|>b") == [ids["<|a|>b"]] and tok.encode("<|a|>c")[0] == ids["<|a|>"]
    assert tok.encode(" \t<L>") == [ids["<L>"]] == tok.encode("<L>")
    assert tok.encode("<R> \n") == [ids["<R>"]]
    assert tok.encode("e\u0301te\u0301") == [ids["\u00e9t\u00e9"]] == tok.encode("\u00e9t\u00e9")


@pytest.mark.parametrize("family", ["qwen2.5", pytest.param("llama3", marks=pytest.mark.slow),
                                    pytest.param("smollm2", marks=pytest.mark.slow)])
def test_every_assigned_code_point_round_trips(family):
    """decode(encode(x)) == x (NFC(x) where the family normalises) for the code points of
    Python's Unicode database, a space between each (bench/tokenizer_parity.py compares the
    ids with the tokenizers library's on all of them, in six contexts); the default run leaves
    out the private-use planes past U+F0000, the slow one takes all."""
    tok = load(family)
    cps = assigned_code_points(every=family != "qwen2.5")
    for i in range(0, len(cps), 512):
        text = " ".join(cps[i:i + 512])
        want = unicodedata.normalize("NFC", text) if tok.nfc else text
        assert tok.decode(tok.encode(text)) == want, f"code points from U+{ord(cps[i]):04X}"


@pytest.mark.parametrize("family", list(CHOSEN))
def test_eos_pad_bos_and_chat_format_per_family(family):
    tok = load(family)
    eos, bos, chat, system = CHOSEN[family]
    assert tok.eos_id == tok.encoder[eos] and tok.decode([tok.eos_id]) == eos
    assert tok.bos_id == (tok.encoder[bos] if bos else None)
    assert tok.chat_format.name == chat and tok.chat_format.default_system == system
    # PAD: the first id past the tokens, so never a token and never EOS
    assert tok.pad_id == tok.n_tokens == tok.vocab_size - 1 == max(tok.encoder.values()) + 1
    assert tok.decode([tok.pad_id, *tok.encode("a b"), tok.pad_id]) == "a b"


def test_without_a_chat_template_eos_is_the_configs(tmp_path):
    """Llama 3's base files (no template): EOS is tokenizer_config.json's <|end_of_text|>; with
    neither a template nor an eos_token there is no EOS to stop at: refused."""
    folder = shutil.copytree(os.path.join(FIXTURES, "llama3"), tmp_path / "base")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    config["eos_token"] = {"content": "<|end_of_text|>", "special": True}  # an older file's form
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = BPETokenizer.from_pretrained(str(folder))
    assert tok.decode([tok.eos_id]) == "<|end_of_text|>" and tok.chat_format.name == "plain"
    assert tok.bos_id == tok.encoder["<|begin_of_text|>"]  # the post-processor's, still
    del config["eos_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="eos_token"):
        BPETokenizer.from_pretrained(str(folder))


def test_eos_of_older_files(tmp_path):
    """GPT-2's hub folder: a tokenizer_config.json without eos_token (and maybe a
    special_tokens_map.json that has one): EOS is the map's, else GPT-2's <|endoftext|>."""
    folder = shutil.copytree(os.path.join(FIXTURES, "gpt2"), tmp_path / "gpt2")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    tok = BPETokenizer.from_pretrained(str(folder))
    assert tok.decode([tok.eos_id]) == "<|endoftext|>" and tok.chat_format.name == "plain"
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    last = spec["added_tokens"][-1]["id"]
    spec["added_tokens"].append({"id": last + 1, "content": "<|stop|>", "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|stop|>"}))
    assert BPETokenizer.from_pretrained(str(folder)).eos_id == last + 1


def test_the_state_travels_in_a_checkpoint_and_gives_the_same_ids():
    tok = load("qwen3")
    state = json.loads(json.dumps(tok.state_dict()))  # what a checkpoint holds survives JSON
    again = tokenizer_from_state(state)
    assert same_tokenizer(tok, again) and not same_tokenizer(tok, load("qwen2.5"))
    assert (again.eos_id, again.pad_id, again.chat_format) == (tok.eos_id, tok.pad_id, tok.chat_format)
    for text in expected("qwen3")["texts"]:
        assert again.encode(text) == tok.encode(text)


def test_stdlib_regex_spells_out_unicode_classes():
    qwen = stdlib_regex(r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+")
    assert qwen.findall("IT'S x² 東京 e\u0301") == ["IT", "'S", " x", "²", " 東京", " e", "\u0301"]
    assert stdlib_regex(r"\p{N}{1,3}").findall("12345") == ["123", "45"]
    assert stdlib_regex(r"\s+").findall("a\x1c\x85b") == ["\x85"]  # U+001C is not White_Space


def mutated(tmp_path, change):
    """The qwen3 fixture's files with tokenizer.json changed by `change(spec)`."""
    folder = shutil.copytree(os.path.join(FIXTURES, "qwen3"), tmp_path / "tok")
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    change(spec)
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return str(folder)


def steps(spec):
    return spec["pre_tokenizer"]["pretokenizers"]


REFUSED = [  # (what the file holds, the change, words of the one-line error)
    ("NFKC", lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer step 'NFKC'"),
    ("SentencePiece", lambda s: s.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581"}),
     "no ByteLevel"),
    ("Metaspace step", lambda s: steps(s).insert(0, {"type": "Metaspace"}), "'Metaspace'"),
    ("Unigram", lambda s: s["model"].update(type="Unigram"), "model 'Unigram'"),
    ("byte_fallback", lambda s: s["model"].update(byte_fallback=True), "byte_fallback"),
    ("dropout", lambda s: s["model"].update(dropout=0.1), "dropout"),
    ("single_word", lambda s: s["added_tokens"][0].update(single_word=True), "single_word"),
    ("Split Removed", lambda s: steps(s)[0].update(behavior="Removed"), "Removed"),
    ("prefix space", lambda s: steps(s)[1].update(add_prefix_space=True), "add_prefix_space"),
    ("step after ByteLevel", lambda s: steps(s).append({"type": "Digits"}), "after ByteLevel"),
    ("\\w", lambda s: steps(s)[0]["pattern"].update(Regex=r"\w+|\s+"), r"\\w"),
    ("line anchor", lambda s: steps(s)[0]["pattern"].update(Regex=r"^\s+|\S+"), "'\\^"),
    ("script class", lambda s: steps(s)[0]["pattern"].update(Regex=r"\p{Han}+|."), "Han"),
    ("EOS appended", lambda s: s.update(post_processor={"type": "TemplateProcessing", "single": [
        {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "special_tokens": {}}), "TemplateProcessing"),
    ("Roberta", lambda s: s.update(post_processor={"type": "RobertaProcessing"}), "RobertaProcessing"),
    ("decoder", lambda s: s.update(decoder={"type": "Metaspace"}), "decoder"),
    ("bad merge", lambda s: s["model"]["merges"].append(["Ġ", "no-such-token"]), "merge"),
    ("id gap", lambda s: s["added_tokens"][-1].update(id=10 ** 6), "without gaps"),
]


@pytest.mark.parametrize("change,words", [(c, w) for _, c, w in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_steps_we_do_not_implement_are_refused(tmp_path, change, words):
    with pytest.raises(UserError, match=words) as e:
        BPETokenizer.from_pretrained(mutated(tmp_path, change))
    assert "\n" not in str(e.value)


def test_an_unknown_chat_template_loads_but_refuses_conversations(tmp_path):
    from mingpt_rlhf.machinery.chat import prompt_text
    folder = shutil.copytree(os.path.join(FIXTURES, "qwen3"), tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = BPETokenizer.from_pretrained(str(folder))
    assert tok.decode([tok.eos_id]) == "<|im_end|>"  # the config's eos_token
    with pytest.raises(UserError, match="chat template"):
        prompt_text(tok.chat_format, [("user", "hi")])


def test_gpt2_files_still_read_as_before(tmp_path):
    """A folder with vocab.json + merges.txt and no tokenizer.json: GPT-2's path, its state as
    before (checkpoints written earlier compare equal)."""
    from test_bpe import make_files
    tok = BPETokenizer.from_pretrained(str(make_files(tmp_path)))
    assert set(tok.state_dict()) == {"type", "encoder", "merges"} and tok.bos_id is None
    assert tok.chat_format is None and tok.n_tokens == tok.pad_id == tok.vocab_size - 1


def test_a_model_file_path_finds_the_tokenizer_beside_it(tmp_path):
    folder = shutil.copytree(os.path.join(FIXTURES, "llama3"), tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"")
    assert same_tokenizer(BPETokenizer.from_pretrained(str(folder / "model.safetensors")), load("llama3"))


def test_fixtures_are_small():
    for family in FAMILIES:
        spec = json.loads(open(os.path.join(FIXTURES, family, "tokenizer.json"), encoding="utf-8").read())
        assert len(spec["model"]["merges"]) <= 400, family
