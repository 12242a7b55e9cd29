"""Our tokenizer.json reader against Hugging Face's `tokenizers`, family by family, and the
fixtures the default tests check it with (they cannot import `tokenizers`).

Run in the trl1 venv, which has `tokenizers` (nothing is downloaded):

    bench/peers/trl1/.venv/bin/python bench/tokenizer_parity.py
    bench/peers/trl1/.venv/bin/python bench/tokenizer_parity.py --write_fixtures

For each family we build what its published tokenizer.json holds, step for step (the facts:
Qwen2.5 / Qwen3 NFC + Split(Qwen's regex) + ByteLevel without regex; Llama 3 Split(its regex,
digits in threes) + ByteLevel, ignore_merges, <|begin_of_text|> put first by
TemplateProcessing; SmolLM2 Digits(individual) + ByteLevel with GPT-2's regex; GPT-2
ByteLevel with its regex; each family's special tokens where its ids put them, Qwen3's
<think> tokens as non-special added ones), train its BPE merges with `tokenizers` on the
benchmark text of bench/bench_pretrained.py (Python's own sources and generated sentences in
several scripts), save it with a tokenizer_config.json naming EOS, BOS and a chat template of
the family's format, and read it back with `BPETokenizer.from_pretrained`. "options" is
Qwen's pipeline with added tokens that use lstrip, rstrip, normalized and overlapping
contents. Then every id must be equal, on:
- every paragraph of the text (`--text_kb` of it),
- the hand-made strings below (emoji and ZWJ sequences, CJK, Arabic, combining accents,
  digit runs, whitespace and newline runs, tabs, CRLF, contractions in capitals, control
  characters, special tokens inside text, the empty string),
- every code point Python's Unicode database assigns (surrogates aside), each after a
  letter, a digit, a space, a "!", an apostrophe and a newline, in chunks of 64;
and decode(encode(x)) must give x (NFC(x) where the family normalises), and `tokenizers`'
decode the same text. The ids with the post-processor (`add_special_tokens=True`) must be ours
with `bos_id` in front where the family declares one.

Writes bench/results/tokenizer_parity.json (counts, mismatches if any, command, date,
commit). `--write_fixtures` also writes tests/fixtures/tokenizers/<family>/: the tokenizer
files trained with `--fixture_merges` merges, and expected.json (texts and `tokenizers`' ids).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import unicodedata
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from mingpt_rlhf.machinery.cli import opt, run  # noqa: E402

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
QWEN25_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                  "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                  "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
                  "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
QWEN3_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]  # not special
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                  "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
SMOLLM2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                   "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
                   "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
                   "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
# chat templates of our own writing that carry what chat.format_of_template reads from the
# real ones (their markers, a default system message, Qwen3's empty think block, Llama 3.1's
# system header and fixed date)
CHATML_TEMPLATE = ("{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\n{SYSTEM}"
                   "<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{{- '<|im_start|>' + m['role'] "
                   "+ '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                   "{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN3_TEMPLATE = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                  "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>"
                  "assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
                  "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
LLAMA3_TEMPLATE = ("{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = "
                   "\"26 Jul 2024\" %}{%- endif %}{{- '<|start_header_id|>system<|end_header_id|>"
                   "\\n\\n' }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" "
                   "+ date_string + \"\\n\\n\" }}{%- for m in messages %}{{- '<|start_header_id|>' + "
                   "m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
                   "{%- endfor %}")
FAMILIES = {  # name: how its tokenizer.json is built (see `build`) and its tokenizer_config.json
    "qwen2.5": dict(nfc=True, split=QWEN_REGEX, specials_last=QWEN25_SPECIAL, string_merges=True,
                    config={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                            "chat_template": CHATML_TEMPLATE.replace(
                                "{SYSTEM}", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")}),
    "qwen3": dict(nfc=True, split=QWEN_REGEX, specials_last=QWEN25_SPECIAL, added_last=QWEN3_ADDED,
                  config={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                          "chat_template": QWEN3_TEMPLATE}),
    "llama3": dict(split=LLAMA3_REGEX, specials_last=LLAMA3_SPECIAL, ignore_merges=True,
                   bos="<|begin_of_text|>",
                   config={"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>",
                           "chat_template": LLAMA3_TEMPLATE}),
    "smollm2": dict(digits=True, gpt2_regex=True, specials_first=SMOLLM2_SPECIAL,
                    config={"eos_token": "<|im_end|>", "bos_token": "<|im_start|>",
                            "chat_template": CHATML_TEMPLATE.replace(
                                "{SYSTEM}", "You are a helpful AI assistant named SmolLM, trained by Hugging Face")}),
    "gpt2": dict(gpt2_regex=True, specials_last=["<|endoftext|>"],
                 config={"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}),
    "options": dict(nfc=True, split=QWEN_REGEX, specials_last=["<|endoftext|>", "<|a|>", "<|a|>b"],
                    options=True, config={"eos_token": "<|endoftext|>"}),
}
HAND_MADE = [
    "", " ", "\n", "Hello world", "  two leading", "trailing   ", "multiple   spaces\tand\t\ttabs",
    "new\nlines\n\n\nand\r\nCRLF \r\n\r\n  \n", "emoji 😀👍🏽 and a family 👨‍👩‍👧 and a flag 🇺🇸 !",
    "naïve café résumé Ångström", "combining e\u0301 and n\u0303 and A\u030a (NFC composes them)",
    "digits 1 12 123 1234 12345 3.14 1,000,000 x² ½ Ⅻ ٣٤ ４２", "it's don't we'll they're I've I'm he'd",
    "IT'S DON'T WE'LL THEY'RE I'VE I'M HE'D It'S", "mixed 東京は晴れ Ελληνικά русский עברית",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣", "中文分词测试：你好，世界！", "한국어 텍스트입니다",
    "symbols !!! ??? ... --- $$$ @#% ''' \"q\" ((x)) [y] {z}", "nbsp\u00a0and\u2003em space",
    "zero\u200bwidth\u200djoiner", "\x00\x01\x07\x1b\x1c\x1f\x7f control \x85", "ﬁ ligature ﬅ ſ Kelvin K",
    "under_score snake_case CamelCase", "'s at start", "end with '", "tab\t\tthen  \t mixed",
    "   \n", "x\u3000ideographic space", "code:\n    def f(x):\n        return x ** 2  # c\n",
    "a<|endoftext|>b", "<|endoftext|><|endoftext|> x ", "<|im_start|>user\nHi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<think>\n\n</think>\n\n answer", "<|im_end|><|im_end|>", "<|endoftext",
    "a <|a|> b<|a|>bc <|a|>  <|a|>b x", "word <L>  left  <R>  right  <LR>  both\t<LR>\n",
    "\u00e9t\u00e9 and e\u0301te\u0301 and ete\u0301", "<n> e\u0301<n>", "Mixed <|im_start|>\u0301 marks",
]


@dataclass
class Config:
    text_kb: int = opt(1024, "size of the benchmark text the BPE merges are learnt from and "
                             "compared on, in KB")
    merges: int = opt(4000, "merges learnt for the comparison")
    families: str = opt(",".join(FAMILIES), "comma-separated families to compare")
    code_points: bool = opt(True, "also compare on every assigned code point (the slow part)")
    write_fixtures: bool = opt(False, "write tests/fixtures/tokenizers/<family>/ too")
    fixture_merges: int = opt(200, "merges of the fixtures' tokenizers (kept small)")
    out: str = opt("bench/results/tokenizer_parity.json", "where the JSON result is written")


def build(name: str, corpus: list[str], n_merges: int, folder: str):
    """Train the family's tokenizer with `tokenizers` and save its files in `folder`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
        pre_tokenizers, processors, trainers
    spec = FAMILIES[name]
    tok = Tokenizer(models.BPE(ignore_merges=spec.get("ignore_merges", False)))
    if spec.get("nfc"):
        tok.normalizer = normalizers.NFC()
    steps = []
    if spec.get("digits"):
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if spec.get("split"):
        steps.append(pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=bool(spec.get("gpt2_regex"))))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    first = spec.get("specials_first", [])
    trainer = trainers.BpeTrainer(vocab_size=256 + len(first) + n_merges, special_tokens=first,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(spec.get("specials_last", []))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.get("added_last", [])])
    if spec.get("options"):
        tok.add_tokens([AddedToken("<L>", lstrip=True, special=True, normalized=False),
                        AddedToken("<R>", rstrip=True, special=True, normalized=False),
                        AddedToken("<LR>", lstrip=True, rstrip=True, special=False, normalized=False),
                        AddedToken("\u00e9t\u00e9", special=False, normalized=True),
                        AddedToken("<n>", special=False, normalized=True)])
    byte_level = processors.ByteLevel(trim_offsets=False)
    if spec.get("bos"):
        bos = spec["bos"]
        tok.post_processor = processors.Sequence([byte_level, processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
            special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = byte_level
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path, pretty=False)
    if spec.get("string_merges") or spec.get("ignore_merges"):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if spec.get("string_merges"):  # Qwen2.5's files write each merge as "left right"
            data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        if spec.get("ignore_merges"):
            add_whole_words(tok, data, corpus)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_file(path)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(spec["config"], f, ensure_ascii=False, indent=1)
    return tok


def add_whole_words(tok, data: dict, corpus: list[str], n: int = 40) -> None:
    """Llama 3's vocabulary (converted from tiktoken's) holds whole words its merges do not
    build, which `ignore_merges` encodes as one token; a trained vocabulary has none. Add the
    `n` most frequent words the merges split, as tokens of their own (the added tokens' ids
    move up to make room)."""
    from collections import Counter
    words = Counter(piece for text in corpus[:2000] for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text))
    vocab = data["model"]["vocab"]
    chosen = [w for w, _ in words.most_common() if w not in vocab and len(tok.model.tokenize(w)) > 1][:n]
    first = len(vocab)
    for k, w in enumerate(chosen):
        vocab[w] = first + k
    for t in data["added_tokens"]:
        t["id"] += len(chosen)
    for p in data["post_processor"].get("processors", []):
        for special in p.get("special_tokens", {}).values():
            special["ids"] = [i + len(chosen) for i in special["ids"]]


def code_point_texts() -> list[str]:
    """Every assigned code point (no surrogates), after each of six neighbours, in chunks."""
    cps = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    return ["".join(left + c for c in cps[i:i + 64]) for left in ("a", "1", " ", "!", "'", "\n")
            for i in range(0, len(cps), 64)]


def compare(hf, ours, texts: list[str], nfc: bool, bos_id) -> dict:
    """Counts of texts whose ids, decoded text or post-processed ids differ, with examples."""
    bad_ids, bad_decode, bad_hf_decode, bad_bos, examples, decode_examples = 0, 0, 0, 0, [], []
    encoded = hf.encode_batch(texts, add_special_tokens=False)
    with_special = hf.encode_batch(texts, add_special_tokens=True)
    for text, enc, full in zip(texts, encoded, with_special):
        mine = ours.encode(text)
        if mine != enc.ids:
            bad_ids += 1
            if len(examples) < 5:
                examples.append({"text": text[:200], "ours": mine[:40], "tokenizers": enc.ids[:40]})
        want = unicodedata.normalize("NFC", text) if nfc else text
        bad_decode += ours.decode(mine) != want
        theirs = hf.decode(enc.ids, skip_special_tokens=False)
        if theirs != ours.decode(enc.ids):
            bad_hf_decode += 1
            if len(decode_examples) < 3:
                decode_examples.append({"text": text[:200], "ours": ours.decode(enc.ids)[:200],
                                        "tokenizers": theirs[:200]})
        bad_bos += full.ids != ([bos_id] if bos_id is not None else []) + enc.ids
    return {"texts": len(texts), "tokens": sum(len(e.ids) for e in encoded), "ids_differ": bad_ids,
            "round_trip_differs": bad_decode, "decode_differs_from_tokenizers": bad_hf_decode,
            "bos_differs": bad_bos, "examples": examples, "decode_examples": decode_examples}


def write_fixture(name: str, corpus: list[str], n_merges: int) -> None:
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    folder = os.path.join(ROOT, "tests", "fixtures", "tokenizers", name)
    hf = build(name, corpus, n_merges, folder)
    texts = HAND_MADE + [p[:300] for p in corpus[:: max(1, len(corpus) // 40)]][:40]
    expected = {"texts": texts, "ids": [hf.encode(t, add_special_tokens=False).ids for t in texts],
                "with_post_processor": [hf.encode(t).ids for t in texts[:5]]}
    with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
    ours = BPETokenizer.from_pretrained(folder)
    assert [ours.encode(t) for t in texts] == expected["ids"], f"{name}: the fixture disagrees"


def main(cfg: Config) -> dict:
    import tokenizers
    from bench_pretrained import bench_text
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    from results_file import measured
    started = time.time()
    corpus = [p for p in bench_text(cfg.text_kb * 1024).split("\n\n") if p.strip()]
    cp_texts = code_point_texts() if cfg.code_points else []
    result = {"bench": "tokenizer_parity", "measured": measured(ROOT),
              "command": "bench/peers/trl1/.venv/bin/python bench/tokenizer_parity.py " +
                         " ".join(sys.argv[1:]),
              "config": asdict(cfg), "tokenizers": tokenizers.__version__,
              "unicode": unicodedata.unidata_version, "python": sys.version.split()[0],
              "families": {}}
    for name in cfg.families.split(","):
        with tempfile.TemporaryDirectory() as folder:
            hf = build(name, corpus, cfg.merges, folder)
            ours = BPETokenizer.from_pretrained(folder)
        nfc = bool(FAMILIES[name].get("nfc"))
        row = {"vocabulary": hf.get_vocab_size(), "n_tokens": ours.n_tokens, "eos_id": ours.eos_id,
               "pad_id": ours.pad_id, "bos_id": ours.bos_id, "chat_format": ours.chat_format.name,
               "text": compare(hf, ours, corpus, nfc, ours.bos_id),
               "hand_made": compare(hf, ours, HAND_MADE, nfc, ours.bos_id)}
        if cp_texts:
            row["code_points"] = compare(hf, ours, cp_texts, nfc, ours.bos_id)
        result["families"][name] = row
        print(name, json.dumps({k: {m: v[m] for m in ("texts", "ids_differ", "round_trip_differs")}
                                for k, v in row.items() if isinstance(v, dict)}), flush=True)
        if cfg.write_fixtures:
            write_fixture(name, corpus, cfg.fixture_merges)
    result["seconds"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(os.path.join(ROOT, cfg.out)), exist_ok=True)
    with open(os.path.join(ROOT, cfg.out), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    return result


if __name__ == "__main__":
    run(main, Config)
