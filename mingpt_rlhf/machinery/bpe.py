"""Byte-level BPE: GPT-2's tokenizer, and today's families' (Qwen2/2.5, Qwen3, Llama 3, SmolLM2).

Concept (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", sec. 2.2;
BPE itself is Sennrich et al. 2016). Encoding a string takes these steps:
0. **Added tokens out.** Special tokens written in the text (`<|endoftext|>`, `<|im_end|>`, ...)
   are cut out first and become their one id each; BPE never sees them, so no text can spell
   one in pieces. The longest one that matches wins where two start at the same place.
1. **Normalise** (some families only): Qwen composes the text to Unicode NFC first, so "e" +
   U+0301 (combining acute) and the single code point "é" give the same ids.
2. **Pre-tokenise** with regexes into words: contractions ('s 't 're 've 'm 'll 'd), runs of
   letters, numbers, runs of other symbols, and whitespace. Merges never cross these
   boundaries, so " dog" is one word and "dog." two. The families differ here: GPT-2 keeps a
   run of digits together, Llama 3 cuts digits in groups of at most three, Qwen and SmolLM2 one
   by one; Qwen and Llama 3 put a newline run in a word of its own.
3. **Bytes as characters.** Each word's UTF-8 bytes are written as printable characters
   (`byte_to_unicode`), so any text at all (emoji, control bytes) is spelt by 256 base
   symbols and nothing is ever "unknown". A space becomes 'Ġ', a newline 'Ċ'.
4. **Merge.** Repeatedly fuse the adjacent pair with the lowest rank in the merges list (rank
   = line order: the order the pairs were learnt), until no listed pair is left. The rank
   order matters: "abc" with merges ["b c", "a b"] gives ["a", "bc"], not ["ab", "c"].
   Llama 3 sets `ignore_merges`: a word that is a token of the vocabulary as a whole is that
   token, without merging (merging could reach it another way, or not at all).
Decoding joins the tokens' bytes (an added token's are its text's) and reads them as UTF-8.

Files: GPT-2 publishes `vocab.json` (token string -> id) and `merges.txt` (a "#version" line,
then one "left right" pair per line, best first); today's families publish one
`tokenizer.json` holding the vocabulary, the merges and each step above by name
(machinery/tokenizer_json.py reads it, and refuses a step we do not implement).

Special ids: PAD is a new id, `n_tokens` (50257 for GPT-2: the first id after the last token),
distinct from EOS (tokenizer.py says why); load the model with
`GPT.from_pretrained(name, vocab_size=tok.vocab_size)` so the embedding has a row for it.
`decode` drops PADs. EOS is `<|endoftext|>` for GPT-2; for a tokenizer.json, see
tokenizer_json.py. `bos_id` is the token the family puts first in every sequence (Llama 3's
`<|begin_of_text|>`), or None; `encode` never adds it (a prompt and its response are encoded
apart and joined): data.py puts it in front of a sequence's first text.

The regexes, with the stdlib `re`: the families write them for the `regex` module (GPT-2) or
Oniguruma (Hugging Face's `tokenizers`), with `\\p{L}` (letter) and `\\p{N}` (number), which `re`
lacks. `stdlib_regex` spells those out as explicit character classes built from `unicodedata`
categories, and `\\s` as Unicode's White_Space list (`re`'s own `\\s` also matches the four
separators U+001C-U+001F, theirs does not). This is exact for every code point assigned in
Python's Unicode database (14.0 for Python 3.11; bench/tokenizer_parity.py checks each one
against `tokenizers`); a code point assigned only in a later Unicode version counts as
"other" here and may be grouped differently than by a newer library. The encoded bytes, and
so round trips, are unaffected. NFC is Python's `unicodedata.normalize`, of the same version.

Try it:  python -c "from mingpt_rlhf.machinery.bpe import BPETokenizer as B; t=B.from_pretrained('gpt2'); print(t.encode('Hello world<|endoftext|>'))"
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from typing import NamedTuple

from .errors import UserError

EOT = "<|endoftext|>"
MAX_CACHE = 200_000  # cached words; cleared when full, so a huge corpus cannot exhaust memory
# GPT-2's pre-tokenisation regex, as written for the `regex` module (and for `tokenizers`'
# ByteLevel step with use_regex). `\s+(?!\S)` leaves the last space of a run for the next
# word: "a   b" -> "a", "  ", " b".
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Unicode's White_Space property: what `\s` means to `regex`, Oniguruma and Rust
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table byte -> printable character.

    Bytes that are already visible, non-space Latin-1 characters ('!'..'~', '¡'..'¬',
    '®'..'ÿ') stand for themselves; the other 68 (control bytes, space, DEL, NBSP, soft
    hyphen) are moved to U+0100 onwards, in byte order, so BPE never sees whitespace or
    control characters inside a token.
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for b in range(256):
        if b in visible:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


# ---- the regexes in stdlib `re` --------------------------------------------------------------

_RANGES: dict[str, list[tuple[int, int]]] = {}  # general category ("Lu", ...) -> code point ranges
_COMPILED: dict[str, re.Pattern] = {}           # regex source -> compiled stdlib pattern


def _class_of(category: str) -> str:
    """A character class body for every code point of a general category: one letter for a
    group ("L" for \\p{L}: Lu, Ll, Lt, Lm, Lo) or two for one category ("Lu")."""
    if not _RANGES:  # one pass over all code points (~0.3 s), once per process
        start, current = 0, unicodedata.category("\0")
        for cp in range(1, 0x110001):
            cat = unicodedata.category(chr(cp)) if cp < 0x110000 else None
            if cat != current:
                _RANGES.setdefault(current, []).append((start, cp - 1))
                start, current = cp, cat
    parts = []
    for a, b in sorted(r for cat, ranges in _RANGES.items() if cat.startswith(category)
                       for r in ranges):
        if parts and parts[-1][1] == a - 1:  # adjacent ranges of two categories join
            parts[-1] = (parts[-1][0], b)
        else:
            parts.append((a, b))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                   for a, b in parts)


_CATEGORIES = {"L", "M", "N", "P", "S", "Z", "C", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc",
               "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
               "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cs", "Cn"}
_ESCAPE = re.compile(r"\\(?:([pP])\{(\w+)\}|(.))", re.S)
_INLINE_FLAGS = re.compile(r"\(\?(?!i[:)])[a-zA-Z-]+[:)]")  # flags other than (?i:...)


def stdlib_regex(source: str) -> re.Pattern:
    """`source` (a pattern for `regex` / Oniguruma) compiled by the stdlib `re`: `\\p{X}` and
    `\\P{X}` for a general category X become explicit classes, `\\s` / `\\S` Unicode's
    White_Space; every other construct the families use (alternation, `(?i:...)`, lookahead,
    `{1,3}`, possessive `?+`) means the same in `re`. An escape we cannot translate exactly
    (`\\w`, `\\d`, `\\b`, a script like `\\p{Han}`, ...) is a UserError, never a silently
    different split. Compiled patterns are cached."""
    if source in _COMPILED:
        return _COMPILED[source]
    space = re.escape(WHITE_SPACE)
    out, i, in_class = [], 0, False
    while i < len(source):
        c = source[i]
        if c == "\\":
            m = _ESCAPE.match(source, i)
            if m is None:
                raise UserError(f"the regex {source!r} ends with a lone backslash; fix tokenizer.json")
            negated, category, char = m.group(1) == "P", m.group(2), m.group(3)
            if category is not None:
                if category not in _CATEGORIES:
                    raise UserError(f"the regex {source!r} uses \\p{{{category}}}; only general "
                                    f"categories (L, N, Lu, ...) are translated for Python's re")
                body = _class_of(category)
                if in_class and negated:
                    raise UserError(f"the regex {source!r} negates \\P{{{category}}} inside [...], "
                                    f"which Python's re cannot write")
                out.append(body if in_class else f"[{'^' if negated else ''}{body}]")
            elif char in "sS":
                if in_class and char == "S":
                    raise UserError(f"the regex {source!r} uses \\S inside [...], which Python's "
                                    f"re cannot write")
                out.append(space if in_class else f"[{'^' if char == 'S' else ''}{space}]")
            elif char.isalnum() and char not in "nrtfvx":
                raise UserError(f"the regex {source!r} uses \\{char}, whose meaning differs between "
                                f"Python's re and the tokenizers library; we do not translate it")
            else:
                out.append(m.group(0))
            i = m.end()
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            if source.startswith("^", i):
                out.append("^")
                i += 1
            if source.startswith("]", i):  # a "]" first in a class is a literal in both
                out.append(r"\]")
                i += 1
            continue
        if c == "[":
            raise UserError(f"the regex {source!r} nests [...] classes, which Python's re reads "
                            f"otherwise; we do not translate it")
        if c == "]" and in_class:
            in_class = False
        elif not in_class and (c in "^$" or _INLINE_FLAGS.match(source, i)):
            # Oniguruma's ^ and $ match at every line, (?m) means dot-all: not so in re
            raise UserError(f"the regex {source!r} uses {source[i:i + 4]!r}, which means "
                            f"another thing in Python's re; we do not translate it")
        out.append(c)
        i += 1
    try:
        _COMPILED[source] = re.compile("".join(out))
    except re.error as e:
        raise UserError(f"the regex {source!r} does not compile in Python's re ({e}); we cannot "
                        f"pre-tokenise with it") from None
    return _COMPILED[source]


def gpt2_pattern() -> re.Pattern:
    """GPT-2's pre-tokenisation regex in stdlib `re` (built once, ~0.3 s, then cached)."""
    return stdlib_regex(GPT2_REGEX)


def split_isolated(pattern: re.Pattern, text: str) -> list[str]:
    """`text` cut into the matches of `pattern` and the gaps between them, in order (the
    `tokenizers` library's Split with "Isolated"). The families' patterns match everywhere, so
    the matches alone cover the text and one `findall` does it."""
    if not pattern.groups:
        pieces = pattern.findall(text)
        if sum(map(len, pieces)) == len(text):  # matches never overlap: no gap between them
            return pieces
    pieces, end = [], 0
    for m in pattern.finditer(text):
        if m.start() > end:
            pieces.append(text[end:m.start()])
        if m.end() > m.start():
            pieces.append(m.group(0))
        end = m.end()
    if end < len(text):
        pieces.append(text[end:])
    return pieces


def fuse_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    """Fuse every occurrence of `pair` in `symbols`, left to right ("a a a" -> "aa a")."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


# ---- added tokens ------------------------------------------------------------------------------

class AddedToken(NamedTuple):
    """A token cut out of the text before BPE. `lstrip` / `rstrip`: the match also takes the
    white space on its left / right (it is then part of the token, and lost to decoding);
    `normalized`: matched in the normalised text rather than the raw one. `special` only
    marks it for the files (the `tokenizers` library recognises both kinds in text)."""
    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False


class AddedMatcher:
    """Finds added tokens in a text: the leftmost match, and the longest of those starting there."""

    def __init__(self, tokens: list[AddedToken]):
        self.by_text = {t.content: t for t in tokens}
        by_length = sorted(self.by_text, key=len, reverse=True)  # alternation takes the first
        self.pattern = re.compile("|".join(map(re.escape, by_length)))
        self.split_pattern = re.compile(f"({self.pattern.pattern})")
        self.strips = any(t.lstrip or t.rstrip for t in tokens)

    def split(self, text: str) -> list[tuple[str, int | None]]:
        """[(piece, id of the added token or None for plain text), ...] covering `text`."""
        if not self.strips:  # the common case: one C-level split, tokens at the odd places
            parts = self.split_pattern.split(text)
            return [(p, self.by_text[p].id if k % 2 else None) for k, p in enumerate(parts)
                    if p or k % 2]
        out, done = [], 0
        for m in self.pattern.finditer(text):
            token, start, stop = self.by_text[m.group(0)], m.start(), m.end()
            if token.lstrip:  # back over the white space before it, not into an earlier match
                start = max(len(text[:start].rstrip(WHITE_SPACE)), done)
            if token.rstrip:
                stop = len(text) - len(text[stop:].lstrip(WHITE_SPACE))
            if start > done:
                out.append((text[done:start], None))
            out.append((text[start:stop], token.id))
            done = stop
        if done < len(text):
            out.append((text[done:], None))
        return out


# ---- the tokenizer -------------------------------------------------------------------------------

class BPETokenizer:
    """Byte-level BPE. `encoder`: token string -> id, ids 0..n-1 without gaps (the vocabulary
    and the added tokens); `merges`: (left, right) pairs, best first. The defaults are
    GPT-2's; a tokenizer.json gives the rest (machinery/tokenizer_json.py):
    `added`: the added tokens (default: `<|endoftext|>`); `pre_tokenizer`: regex sources,
    applied one after the other, each to the pieces of the one before; `nfc`: normalise to
    NFC first; `bos_token`: put in front of each sequence by data.py; `chat_format` (chat.py);
    `files`: the files it was read from, kept for `state_dict`.

    Attributes of the interface: `n_tokens` (ids 0..n_tokens-1 are tokens; a model's output
    rows at or past it have no token and are never sampled), `vocab_size` (n_tokens + 1: PAD
    is the first id past the tokens), `pad_id`, `eos_id`, `bos_id` (or None)."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]], eos_token: str = EOT,
                 added: list[AddedToken] | None = None, pre_tokenizer: tuple[str, ...] = (GPT2_REGEX,),
                 nfc: bool = False, ignore_merges: bool = False, bos_token: str | None = None,
                 chat_format=None, files: dict | None = None):
        ids = sorted(encoder.values())
        if ids != list(range(len(encoder))):
            raise UserError("BPE vocabulary ids must be 0..n-1 without gaps or repeats; "
                            "is vocab.json from GPT-2's tokenizer?")
        if eos_token not in encoder:
            raise UserError(f"BPE vocabulary has no {eos_token!r} token; GPT-2's vocab.json has "
                            f"{EOT!r} (id 50256): use the published file")
        self.encoder = dict(encoder)
        self.decoder = {i: s for s, i in encoder.items()}
        self.merges = [tuple(m) for m in merges]
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.byte_encoder = byte_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.n_tokens = len(encoder)
        self.eos_id = encoder[eos_token]
        self.pad_id = self.n_tokens  # a fresh id, so pad != eos
        self.bos_id = encoder[bos_token] if bos_token is not None else None
        self.nfc, self.ignore_merges, self.chat_format, self.files = nfc, ignore_merges, chat_format, files
        self.added = added if added is not None else [AddedToken(EOT, encoder[EOT])]
        self.raw_added = AddedMatcher([t for t in self.added if not t.normalized]) \
            if any(not t.normalized for t in self.added) else None
        self.normalized_added = AddedMatcher([t._replace(content=self.normalize(t.content))
                                              for t in self.added if t.normalized]) \
            if any(t.normalized for t in self.added) else None
        self.added_ids = {t.id for t in self.added}
        self.patterns = [stdlib_regex(source) for source in pre_tokenizer]
        self.pattern = self.patterns[0] if len(self.patterns) == 1 else None
        self.cache: dict[str, list[int]] = {}
        self._token_bytes = None  # id -> the bytes it stands for, built on the first decode

    @property
    def vocab_size(self) -> int:
        return self.n_tokens + 1  # + PAD

    # ---- loading and saving ----------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_path, merges_path) -> "BPETokenizer":
        """Read GPT-2's `vocab.json` and `merges.txt`."""
        try:
            with open(vocab_path, encoding="utf-8") as f:
                encoder = json.load(f)
            with open(merges_path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except FileNotFoundError as e:
            raise UserError(f"missing tokenizer file {e.filename}; put GPT-2's vocab.json and "
                            "merges.txt (or a tokenizer.json) in that folder, or pass a name such "
                            "as 'gpt2'") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"cannot parse {vocab_path} or {merges_path} ({e}); "
                            "download the files again") from None
        if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
            raise UserError(f"{vocab_path} must be a JSON object token -> integer id")
        merges = []
        for lineno, line in enumerate(lines, 1):
            if not line.strip() or (lineno == 1 and line.startswith("#version")):
                continue
            pair = line.split()
            if len(pair) != 2:
                raise UserError(f"{merges_path}:{lineno}: expected two tokens 'left right', got "
                                f"{line!r}; the file is damaged, download it again")
            merges.append((pair[0], pair[1]))
        return cls(encoder, merges)

    @classmethod
    def from_pretrained(cls, folder_or_name: str) -> "BPETokenizer":
        """From a folder holding a `tokenizer.json` (today's families: read with its
        tokenizer_config.json, see tokenizer_json.py), or GPT-2's vocab.json + merges.txt, or
        a name (gpt2, ...) whose two files are fetched once."""
        from .pretrained import resolve_pretrained
        path = os.path.expanduser(str(folder_or_name))
        folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path
        if os.path.isfile(os.path.join(folder, "tokenizer.json")):
            from .tokenizer_json import read_tokenizer_folder
            return read_tokenizer_folder(folder)
        folder = resolve_pretrained(folder_or_name, files=("vocab.json", "merges.txt"))
        return cls.from_files(os.path.join(folder, "vocab.json"),
                              os.path.join(folder, "merges.txt"))

    def state_dict(self) -> dict:
        if self.files is not None:  # read from a tokenizer.json: the files themselves
            return {"type": "bpe", "files": self.files}
        # tokens never contain a space (byte_to_unicode moved it to 'Ġ'), so "a b" is unambiguous
        return {"type": "bpe", "encoder": dict(self.encoder),
                "merges": [f"{a} {b}" for a, b in self.merges]}

    @classmethod
    def from_state(cls, state: dict) -> "BPETokenizer":
        if "files" in state:
            from .tokenizer_json import tokenizer_from_files
            return tokenizer_from_files(state["files"], "the checkpoint's tokenizer")
        return cls(state["encoder"], [tuple(m.split(" ")) for m in state["merges"]])

    # ---- encoding ----------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        return unicodedata.normalize("NFC", text) if self.nfc else text

    def bpe(self, word: str) -> list[str]:
        """Merge the symbols of one byte-encoded word, lowest rank first, until none applies."""
        symbols = list(word)
        while len(symbols) > 1:
            pairs = set(zip(symbols, symbols[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            symbols = fuse_pair(symbols, best)
        return symbols

    def _encode_word(self, word: str) -> list[int]:
        ids = self.cache.get(word)
        if ids is None:
            spelt = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            if self.ignore_merges and spelt in self.encoder:  # a whole-word token, as it is
                ids = [self.encoder[spelt]]
            else:
                try:
                    ids = [self.encoder[token] for token in self.bpe(spelt)]
                except KeyError as e:
                    raise UserError(f"BPE token {e.args[0]!r} (from {word!r}) is not in the "
                                    "vocabulary; the vocabulary and merges do not belong together") from None
            if len(self.cache) >= MAX_CACHE:
                self.cache.clear()
            self.cache[word] = ids
        return ids

    def _words(self, text: str) -> list[str]:
        """Pre-tokenise plain text (no added token in it), after normalising it."""
        if self.pattern is not None:
            return split_isolated(self.pattern, text)
        words = [text]
        for pattern in self.patterns:  # each step cuts the pieces of the one before
            words = [w for piece in words for w in split_isolated(pattern, piece)]
        return words

    def encode(self, text: str) -> list[int]:
        """Text -> ids. Each added token in the text (`<|endoftext|>`, ...) becomes its one id,
        the rest is BPE. No BOS is added (see the module docstring)."""
        ids: list[int] = []
        pieces = self.raw_added.split(text) if self.raw_added else [(text, None)]
        for piece, added_id in pieces:
            if added_id is not None:
                ids.append(added_id)
                continue
            piece = self.normalize(piece)
            for part, part_id in (self.normalized_added.split(piece) if self.normalized_added
                                  else [(piece, None)]):
                if part_id is not None:
                    ids.append(part_id)
                    continue
                for word in self._words(part):
                    ids.extend(self._encode_word(word))
        return ids

    def decode(self, ids) -> str:
        """Ids -> text. PADs are dropped; an added token is its text; bytes that are not valid
        UTF-8 (a sequence cut in the middle of a character) become U+FFFD, as in GPT-2."""
        if self._token_bytes is None:
            self._token_bytes = {i: (s.encode("utf-8") if i in self.added_ids else
                                     bytes(self.byte_decoder[c] for c in s))
                                 for s, i in self.encoder.items()}
        try:
            data = b"".join(self._token_bytes[int(i)] for i in ids if int(i) != self.pad_id)
        except KeyError as e:
            raise ValueError(f"token id {e.args[0]} is outside the vocabulary "
                             f"(0..{self.vocab_size - 1})") from None
        return data.decode("utf-8", errors="replace")
