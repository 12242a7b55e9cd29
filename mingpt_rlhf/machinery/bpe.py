"""GPT-2's byte-level BPE tokenizer, from the published `vocab.json` and `merges.txt`.

Concept (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", sec. 2.2;
BPE itself is Sennrich et al. 2016). Encoding a string takes three steps:
1. **Pre-tokenise** with a regex into words: contractions ('s 't 're 've 'm 'll 'd), runs of
   letters, runs of numbers, runs of other symbols (each may carry one leading space), and
   whitespace. Merges never cross these boundaries, so " dog" is one word and "dog." two.
2. **Bytes as characters.** Each word's UTF-8 bytes are written as printable characters
   (`byte_to_unicode`), so any text at all (emoji, control bytes) is spelt by 256 base
   symbols and nothing is ever "unknown". A space becomes 'Ġ', a newline 'Ċ'.
3. **Merge.** Repeatedly fuse the adjacent pair with the lowest rank in `merges.txt` (rank =
   line order: the order the pairs were learnt), until no listed pair is left. The rank
   order matters: "abc" with merges ["b c", "a b"] gives ["a", "bc"], not ["ab", "c"].

Files: `vocab.json` maps token string -> id; `merges.txt` starts with a "#version" line, then
one "left right" pair per line, best first.

Special ids: `<|endoftext|>` in the text is always its one id (GPT-2's 50256), never spelt
out. PAD is a new id, `len(vocab)` (50257 for GPT-2), distinct from EOS (tokenizer.py says
why); load the model with `GPT.from_pretrained(name, vocab_size=tok.vocab_size)`
so the embedding has a row for it. `decode` drops PADs.

The regex, with the stdlib `re`: GPT-2 wrote it with the `regex` module's `\\p{L}` (letter) and
`\\p{N}` (number), which `re` lacks. We spell both out as explicit character classes built
from `unicodedata` categories (L* and N*), and `\\s` as Unicode's White_Space list (`re`'s own
`\\s` also matches the four separators U+001C-U+001F, `regex`'s does not). This is exact
for every code point assigned in Python's Unicode database (14.0 for Python 3.11); a code
point assigned only in a later Unicode version counts as "other" here and may be grouped
differently than by a newer `regex` module. The encoded bytes, and so round trips, are
unaffected.

Try it:  python -c "from mingpt_rlhf.machinery.bpe import BPETokenizer as B; t=B.from_pretrained('gpt2'); print(t.encode('Hello world<|endoftext|>'))"
"""
from __future__ import annotations

import json
import os
import re
import unicodedata

from .errors import UserError

EOT = "<|endoftext|>"
MAX_CACHE = 200_000  # cached words; cleared when full, so a huge corpus cannot exhaust memory


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


_PATTERN = None


def _class_of(categories: str) -> str:
    """A regex character class body for every code point whose category starts with one of
    `categories` (e.g. "L" for \\p{L}), as ranges."""
    parts, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata.category(chr(cp))[0] in categories
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            a, b = re.escape(chr(start)), re.escape(chr(cp - 1))
            parts.append(a if start == cp - 1 else f"{a}-{b}")
            start = None
    return "".join(parts)


def gpt2_pattern() -> re.Pattern:
    """GPT-2's pre-tokenisation regex in stdlib `re` (built once, ~0.3 s, then cached).

    GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    `\\s+(?!\\S)` leaves the last space of a run for the next word: "a   b" -> "a", "  ", " b".
    """
    global _PATTERN
    if _PATTERN is None:
        L, N = _class_of("L"), _class_of("N")
        S = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
        _PATTERN = re.compile(
            rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")
    return _PATTERN


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


class BPETokenizer:
    """Byte-level BPE with GPT-2's rules. `encoder`: token string -> id (contiguous 0..n-1,
    must contain `<|endoftext|>`); `merges`: (left, right) pairs, best first."""

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]]):
        ids = sorted(encoder.values())
        if ids != list(range(len(encoder))):
            raise UserError("BPE vocabulary ids must be 0..n-1 without gaps or repeats; "
                            "is vocab.json from GPT-2's tokenizer?")
        if EOT not in encoder:
            raise UserError(f"BPE vocabulary has no {EOT!r} token; GPT-2's vocab.json has it "
                            "(id 50256): use the published file")
        self.encoder = dict(encoder)
        self.decoder = {i: s for s, i in encoder.items()}
        self.merges = [tuple(m) for m in merges]
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.byte_encoder = byte_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.eos_id = encoder[EOT]
        self.pad_id = len(encoder)  # a fresh id, so pad != eos
        self.pattern = gpt2_pattern()
        self.cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.encoder) + 1  # + PAD

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
                            "merges.txt in that folder, or pass a name such as 'gpt2'") from None
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
        """From a folder holding vocab.json + merges.txt, or a name (gpt2, ...) fetched once."""
        from .pretrained import resolve_pretrained
        folder = resolve_pretrained(folder_or_name, files=("vocab.json", "merges.txt"))
        return cls.from_files(os.path.join(folder, "vocab.json"),
                              os.path.join(folder, "merges.txt"))

    def state_dict(self) -> dict:
        # tokens never contain a space (byte_to_unicode moved it to 'Ġ'), so "a b" is unambiguous
        return {"type": "bpe", "encoder": dict(self.encoder),
                "merges": [f"{a} {b}" for a, b in self.merges]}

    @classmethod
    def from_state(cls, state: dict) -> "BPETokenizer":
        return cls(state["encoder"], [tuple(m.split(" ")) for m in state["merges"]])

    # ---- encoding ----------------------------------------------------------------------------

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
            try:
                ids = [self.encoder[token] for token in self.bpe(spelt)]
            except KeyError as e:
                raise UserError(f"BPE token {e.args[0]!r} (from {word!r}) is not in the vocabulary; "
                                "vocab.json and merges.txt do not belong together") from None
            if len(self.cache) >= MAX_CACHE:
                self.cache.clear()
            self.cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> ids. Each `<|endoftext|>` becomes the single EOS id, the rest is BPE."""
        ids: list[int] = []
        for n, chunk in enumerate(text.split(EOT)):
            if n > 0:
                ids.append(self.eos_id)
            for word in self.pattern.findall(chunk):
                ids.extend(self._encode_word(word))
        return ids

    def decode(self, ids) -> str:
        """Ids -> text. PADs are dropped; bytes that are not valid UTF-8 (a sequence cut in the
        middle of a character) become U+FFFD, as in GPT-2."""
        try:
            spelt = "".join(self.decoder[int(i)] for i in ids if int(i) != self.pad_id)
        except KeyError as e:
            raise ValueError(f"token id {e.args[0]} is outside the vocabulary "
                             f"(0..{self.vocab_size - 1})") from None
        return bytes(self.byte_decoder[c] for c in spelt).decode("utf-8", errors="replace")
