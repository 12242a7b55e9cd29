"""Byte-level BPE's text side: the byte table, and the pre-tokenising regexes in stdlib `re`.

The families write their regexes for the `regex` module (GPT-2) or Oniguruma (Hugging Face's
`tokenizers`), with `\\p{L}` (letter) and `\\p{N}` (number), which `re` lacks. `stdlib_regex`
spells those out as explicit character classes built from `unicodedata` categories, and
`\\s` as Unicode's White_Space list (`re`'s own `\\s` also matches the four separators
U+001C-U+001F, theirs does not); every other construct the families use means the same in
`re`, and one that does not (`\\w`, `^`, a script class, ...) is refused. bpe.py says what
this gives and where it stops.

Try it:  python -c "from mingpt_rlhf.machinery.byte_level import gpt2_pattern; print(gpt2_pattern().findall('Hello  world, it\'s 2024'))"
"""
from __future__ import annotations

import re
import unicodedata

from .errors import UserError

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
