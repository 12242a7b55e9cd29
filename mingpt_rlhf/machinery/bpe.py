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
lacks. `stdlib_regex` (byte_level.py) spells those out as explicit character classes built
from `unicodedata` categories, and `\\s` as Unicode's White_Space list (`re`'s own `\\s` also
matches the four separators U+001C-U+001F, theirs does not). NFC is Python's
`unicodedata.normalize`. Limits: this is exact for every code point assigned in Python's
Unicode database (14.0 for Python 3.11; bench/tokenizer_parity.py checks the ids of each one
against `tokenizers`'); a code point assigned only in a later Unicode version counts as
"other" here and may be grouped, or normalised, otherwise than by a newer library. The
encoded bytes, and so round trips, are unaffected. The white space an lstrip / rstrip added
token takes is lost to decoding; an added token decodes as its own text (`tokenizers` reads
a non-ASCII one spelt in byte symbols as bytes; no family we read has one).

Try it:  python -c "from mingpt_rlhf.machinery.bpe import BPETokenizer as B; t=B.from_pretrained('gpt2'); print(t.encode('Hello world<|endoftext|>'))"
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from typing import NamedTuple

from .byte_level import (GPT2_REGEX, WHITE_SPACE, byte_to_unicode, gpt2_pattern,  # noqa: F401
                         split_isolated, stdlib_regex)                            # (read from here too)
from .errors import UserError
from .tokenizer_json import read_tokenizer_folder, tokenizer_parts

EOT = "<|endoftext|>"
MAX_CACHE = 200_000  # cached words; cleared when full, so a huge corpus cannot exhaust memory


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
        self.added = [AddedToken(*t) for t in added] if added is not None else [AddedToken(EOT, encoder[EOT])]
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
            return cls(**read_tokenizer_folder(folder))
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
            return cls(**tokenizer_parts(state["files"], "the checkpoint's tokenizer"))
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
