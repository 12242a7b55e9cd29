"""A Hugging Face `tokenizer.json` (byte-level BPE) and its `tokenizer_config.json`, read into the
parts of our `BPETokenizer` (bpe.py runs them; `BPETokenizer.from_pretrained` calls this).

A tokenizer.json names each step of the pipeline. We implement the steps today's families use
and refuse every other one with a UserError naming it: a tokenizer that would run differently
from its reference must not run at all.

    step            we run                                     family (what its file holds)
    normalizer      none, NFC (or a Sequence of those)         Qwen2/2.5/3: NFC
    pre_tokenizer   Split(regex or string, Isolated)            Qwen: Split(Qwen regex) + ByteLevel
                    Digits(individual or not)                   Llama 3: Split(Llama regex) + ByteLevel
                    ByteLevel(with or without GPT-2's regex),   SmolLM2: Digits(individual) +
                    last, add_prefix_space off                    ByteLevel(GPT-2 regex)
                    Sequence of those                           GPT-2: ByteLevel(GPT-2 regex)
    model           BPE: vocab, merges ("a b" or [a, b]),       Llama 3: ignore_merges
                    ignore_merges; no dropout, no byte_fallback
    added_tokens    content, id, lstrip, rstrip, normalized,    every family: special tokens
                    special (single_word refused)
    post_processor  none, ByteLevel (offsets only), Template-   Llama 3: <|begin_of_text|> first
                    Processing with tokens before the text only
    decoder         ByteLevel                                   every family
`truncation` and `padding` are ignored: our data code cuts and pads sequences itself.

The ids we choose (say so before a model is built: its rows follow from them):
- EOS: with a chat template we know (chat.py), its end-of-turn token, the token the model
  ends an answer with: `<|im_end|>` (Qwen, SmolLM2), `<|eot_id|>` (Llama 3). A base model whose
  files carry the template (Qwen2.5-0.5B does) gets it too, and learns it in SFT. Without a
  template, the `eos_token` of tokenizer_config.json (`<|endoftext|>`, `<|end_of_text|>`), or
  of special_tokens_map.json (older files); failing both, `<|endoftext|>` where it is a special
  token (GPT-2's files name no EOS: it is the one their code assumes).
- PAD: the first id past the tokens (`n_tokens`): Qwen2.5 151665, Qwen3 151669 (rows their
  151,936-row embeddings already hold and that have no token), Llama 3 128256 and SmolLM2
  49152 (one new row). Never an id with a token, so a PAD can never be sampled as text, and
  never EOS (tokenizer.py says why).
- BOS: the tokens a TemplateProcessing post-processor puts before the text (Llama 3's
  `<|begin_of_text|>`); data.py writes it first in every sequence, unless the text already
  starts with it (Llama 3's chat template writes it).

Try it:  python -c "from mingpt_rlhf.machinery.bpe import BPETokenizer as B; t=B.from_pretrained('tests/fixtures/tokenizers/qwen3'); print(t.eos_id, t.pad_id, t.encode('Hi<|im_end|>'))"
"""
from __future__ import annotations

import json
import os

from .chat import format_of_template
from .byte_level import GPT2_REGEX, byte_to_unicode
from .errors import UserError


def _read_json(path: str, required: bool):
    if not os.path.isfile(path):
        if required:
            raise UserError(f"no {path}; put the model's tokenizer files in that folder")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"cannot parse {path} ({e}); download the file again") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} must hold a JSON object; download the file again")
    return value


def read_tokenizer_folder(folder: str) -> dict:
    """`tokenizer_parts` of a model folder's files: tokenizer.json, tokenizer_config.json (EOS,
    BOS, the chat template), chat_template.jinja (where the template is kept apart)."""
    config = _read_json(os.path.join(folder, "tokenizer_config.json"), required=False) or {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict)
                         and t.get("name") == "default"), None)
    jinja = os.path.join(folder, "chat_template.jinja")
    if template is None and os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            template = f.read()
    files = {"tokenizer.json": _read_json(os.path.join(folder, "tokenizer.json"), required=True),
             "tokenizer_config.json": config, "chat_template": template,
             "special_tokens_map.json": _read_json(os.path.join(folder, "special_tokens_map.json"),
                                                   required=False)}
    return tokenizer_parts(files, folder)


def _token_text(value):
    """A token named in tokenizer_config.json: a string, or {"content": ...} (older files)."""
    return value.get("content") if isinstance(value, dict) else value


def _normalizer(step, where: str) -> bool:
    """True for NFC, False for none."""
    if step is None:
        return False
    kind = step.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        return any([_normalizer(s, where) for s in step.get("normalizers", [])])
    raise UserError(f"{where}/tokenizer.json: normalizer step {kind!r} is not implemented (we run "
                    f"NFC or none); this tokenizer cannot be read exactly")


def _pre_tokenizer(step, where: str) -> list[str]:
    """The regex sources of the pre-tokenizer steps, in order (bpe.BPETokenizer's pre_tokenizer)."""
    kind = step.get("type") if isinstance(step, dict) else None
    if kind == "Sequence":
        sources, steps = [], step.get("pretokenizers", [])
        for i, s in enumerate(steps):
            if isinstance(s, dict) and s.get("type") == "ByteLevel" and i != len(steps) - 1:
                raise UserError(f"{where}/tokenizer.json: a pre-tokenizer step after ByteLevel is "
                                f"not implemented (ByteLevel comes last in every family we read)")
            sources += _pre_tokenizer(s, where)
        return sources
    if kind == "ByteLevel":
        if step.get("add_prefix_space"):
            raise UserError(f"{where}/tokenizer.json: ByteLevel with add_prefix_space is not "
                            f"implemented (no family we read sets it)")
        return [GPT2_REGEX] if step.get("use_regex", True) else []
    if kind == "Split":
        pattern = step.get("pattern", {})
        if step.get("behavior") != "Isolated" or step.get("invert"):
            raise UserError(f"{where}/tokenizer.json: Split with behavior "
                            f"{step.get('behavior')!r}, invert {step.get('invert')} is not "
                            f"implemented (we run Isolated, not inverted)")
        if "Regex" in pattern:
            return [pattern["Regex"]]
        if "String" in pattern:
            return ["".join("\\" + c if not c.isalnum() else c for c in pattern["String"])]
        raise UserError(f"{where}/tokenizer.json: Split pattern {pattern!r} is neither Regex nor String")
    if kind == "Digits":
        # tokenizers' Digits cuts at each numeric character (Rust's is_numeric: Nd, Nl, No)
        return [r"\p{N}|[^\p{N}]+" if step.get("individual_digits") else r"\p{N}+|[^\p{N}]+"]
    raise UserError(f"{where}/tokenizer.json: pre-tokenizer step {kind!r} is not implemented (we "
                    f"run Split, Digits and ByteLevel: byte-level BPE); this tokenizer (a "
                    f"SentencePiece / Metaspace one?) cannot be read exactly")


def _bos_token(step, where: str) -> tuple[str, list] | None:
    """(token, its ids) the post-processor puts before a single text, or None."""
    kind = step.get("type") if isinstance(step, dict) else None
    if step is None or kind == "ByteLevel":  # ByteLevel only trims offsets
        return None
    if kind == "Sequence":
        found = [t for s in step.get("processors", []) if (t := _bos_token(s, where))]
        return found[0] if found else None
    if kind == "TemplateProcessing":
        single = step.get("single", [])
        names = [item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None
                 for item in single]
        text = [i for i, item in enumerate(single) if isinstance(item, dict) and "Sequence" in item]
        if len(text) != 1 or any(names[text[0]:]) or text[0] > 1:
            raise UserError(f"{where}/tokenizer.json: TemplateProcessing {single!r} is not "
                            f"implemented (we put at most one token before the text, none after)")
        if text[0] == 0:
            return None
        return names[0], step.get("special_tokens", {}).get(names[0], {}).get("ids")
    raise UserError(f"{where}/tokenizer.json: post-processor {kind!r} is not implemented (we run "
                    f"ByteLevel and TemplateProcessing)")


def _model(model, where: str) -> tuple[dict, list, bool]:
    """(vocab, merges, ignore_merges) of a BPE model, checked."""
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else model
        raise UserError(f"{where}/tokenizer.json: model {kind!r} is not implemented (we run BPE)")
    for key, off in (("dropout", (None, 0, 0.0)), ("byte_fallback", (None, False)),
                     ("continuing_subword_prefix", (None, "")), ("end_of_word_suffix", (None, ""))):
        if model.get(key) not in off:
            raise UserError(f"{where}/tokenizer.json: BPE with {key} {model.get(key)!r} is not "
                            f"implemented (byte-level BPE has none)")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise UserError(f"{where}/tokenizer.json: model.vocab must map token -> integer id")
    merges = []
    for n, m in enumerate(model.get("merges", [])):
        pair = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(pair, list) and len(pair) == 2 and all(p in vocab for p in pair)
                and pair[0] + pair[1] in vocab):
            raise UserError(f"{where}/tokenizer.json: merge {n} ({m!r}) is not two tokens of the "
                            f"vocabulary that join into one; the file is damaged")
        merges.append((pair[0], pair[1]))
    return vocab, merges, bool(model.get("ignore_merges", False))


def tokenizer_parts(files: dict, where: str) -> dict:
    """BPETokenizer's arguments from {"tokenizer.json": dict, "tokenizer_config.json": dict,
    "chat_template": str or None} (a folder's files, or a checkpoint's copy of them)."""
    spec, config, template = files["tokenizer.json"], files["tokenizer_config.json"], files["chat_template"]
    nfc = _normalizer(spec.get("normalizer"), where)
    pre = spec.get("pre_tokenizer")
    if pre is None or "ByteLevel" not in json.dumps(pre):
        raise UserError(f"{where}/tokenizer.json: no ByteLevel pre-tokenizer: not a byte-level BPE "
                        f"(a SentencePiece tokenizer?); we read byte-level BPE only")
    sources = _pre_tokenizer(pre, where)
    decoder = spec.get("decoder")
    if not (isinstance(decoder, dict) and decoder.get("type") == "ByteLevel"):
        raise UserError(f"{where}/tokenizer.json: decoder {decoder and decoder.get('type')!r} is not "
                        f"implemented (we decode ByteLevel)")
    bos = _bos_token(spec.get("post_processor"), where)
    vocab, merges, ignore_merges = _model(spec.get("model"), where)
    encoder, added = dict(vocab), []
    for t in spec.get("added_tokens") or []:
        if t.get("single_word"):
            raise UserError(f"{where}/tokenizer.json: added token {t.get('content')!r} has "
                            f"single_word, which is not implemented")
        content, i = t.get("content"), t.get("id")
        if not content or encoder.get(content, i) != i:
            raise UserError(f"{where}/tokenizer.json: added token {t!r} clashes with the "
                            f"vocabulary; the file is damaged")
        encoder[content] = i
        added.append((content, i, bool(t.get("special")), bool(t.get("lstrip")),  # bpe.AddedToken
                      bool(t.get("rstrip")), bool(t.get("normalized"))))
    ids = sorted(encoder.values())
    if ids != list(range(len(ids))):
        missing = next(i for i, j in enumerate(ids) if i != j)
        raise UserError(f"{where}/tokenizer.json: ids must run 0..n-1 without gaps or repeats; "
                        f"id {missing} is missing or taken twice")
    symbols, plain = set(byte_to_unicode().values()), {t[0] for t in added}
    if not symbols <= vocab.keys() or any(set(s) - symbols for s in vocab if s not in plain):
        raise UserError(f"{where}/tokenizer.json: the vocabulary is not byte-level (a token is "
                        f"not spelt with the 256 byte symbols); we read byte-level BPE only")
    fmt = format_of_template(template, _token_text(config.get("bos_token")))
    eos = (fmt.end_of_turn or _token_text(config.get("eos_token"))
           or _token_text((files.get("special_tokens_map.json") or {}).get("eos_token"))
           or next((t[0] for t in added if t[0] == "<|endoftext|>" and t[2]), None))
    if eos is None:
        raise UserError(f"{where}: tokenizer_config.json names no eos_token and there is no chat "
                        f"template to take the end of a turn from; add \"eos_token\" to it")
    for name, token in (("EOS", eos), ("BOS", bos and bos[0]), ("chat template's BOS", fmt.bos)):
        if token is not None and token not in encoder:
            raise UserError(f"{where}: the {name} {token!r} is not a token of tokenizer.json")
    if bos is not None and bos[1] != [encoder[bos[0]]]:
        raise UserError(f"{where}/tokenizer.json: TemplateProcessing puts ids {bos[1]} for "
                        f"{bos[0]!r}, whose id is {encoder[bos[0]]}; the file is damaged")
    return dict(encoder=encoder, merges=merges, eos_token=eos, added=added,
                pre_tokenizer=tuple(sources), nfc=nfc, ignore_merges=ignore_merges,
                bos_token=bos and bos[0], chat_format=fmt, files=files)
