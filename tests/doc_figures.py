"""Measured figures in the Markdown that name their source, and the decimals that name none.

A figure states its source in an HTML comment right after it (GitHub does not render it):

    gold 0.952<!-- algorithms.json summary grpo gold -->
    0.943 +- 0.004<!-- algorithms.json summary ppo: {gold} +- {gold_stderr} -->
    0.829-0.857<!-- kl_estimators.json summary reviews_rm/grpo/k3_in_loss gold: {min}-{max} -->
    96-97 %<!-- multiturn.json summary grpo success: {min*100}-{max*100} % -->
    0.90-0.93<!-- verifiable.json runs sort/grpo/*: {min(gold_unseen)}-{max(gold_unseen)} -->
    280-315<!-- algorithms.json runs method=ppo: {min(seconds)}-{max(seconds)} -->

- `NAME.json` is bench/results/NAME.json; the words after it, up to an optional `:`, are the
  path into it, one key (or list index) per word; a key with `*` takes every key it matches
  (`*` every key or item), `name=value` every item of a list whose `name` is `value`.
- Without a `:`, the value at the path is one number, and the marker checks the number just
  before it. With a `:`, the template after it must match the text just before the marker
  (its words as written, the spaces any run of white space, `**` allowed around a number),
  and each `{...}` is a number read at the path plus the dotted key inside the braces: `{gold}`,
  `{gold.mean}`, `{}` for the path itself, with `*K` or `/K` to scale it (`{success*100}`,
  `{ours_peak_mb/1000}`, `{gold_change.mean*-1}`) and, after a `*` in the path,
  `min(...)`, `max(...)` or `mean(...)` over the items.
- A quoted number must be the JSON's value rounded to the digits it shows.

`sourced(text)` checks every marker of a page; `unsourced(text, allowed, spans)` lists the
decimals of a page's prose (or of its `sourced_blocks`: the paragraphs and list items that hold
an `<!-- every figure sourced -->`) that no marker covers and no allowed phrase holds.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results")
MARKER = re.compile(r"<!--\s*([\w.-]+\.json)\s+(.*?)\s*-->", re.S)
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"
PLACEHOLDER = re.compile(r"\{(?:(min|max|mean)\()?([^{}()*/]*)\)?(?:([*/])(-?[\d.]+))?\}")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:\.\d+)*")


def load(name: str, cache: dict = {}) -> dict:  # noqa: B006 (a cache on purpose)
    if name not in cache:
        with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
            cache[name] = json.load(f)
    return cache[name]


def walk(node, keys: list[str]):
    """The value at `keys` below `node`. A key with a `*` (`*`, `sort/grpo/*`) takes every key
    of a dict it matches, `name=value` every item of a list whose `name` is `value`: the rest
    of the path is then followed from each, and the result is a list."""
    for i, key in enumerate(keys):
        if "*" in key or (isinstance(node, list) and "=" in key):
            if isinstance(node, dict):
                items = [v for k, v in node.items() if fnmatch.fnmatchcase(k, key)]
            elif "=" in key:
                name, _, value = key.partition("=")
                items = [item for item in node if str(item.get(name)) == value]
            else:
                items = list(node)
            if not items:
                raise KeyError(key)
            return [walk(item, keys[i + 1:]) for item in items]
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def lookup(node, placeholder: re.Match, many: bool) -> float:
    fn, path, op, factor = placeholder.groups()
    keys = [k for k in path.split(".") if k]
    if many:
        assert fn, f"{{{path}}} after a * in the path needs min(), max() or mean()"
        values = [float(walk(item, keys)) for item in node]
        value = {"min": min, "max": max, "mean": lambda v: sum(v) / len(v)}[fn](values)
    else:
        value = float(walk(node, keys))
    if op:
        value = value * float(factor) if op == "*" else value / float(factor)
    return value


def near(quoted: str, value: float) -> bool:
    """`quoted` is `value` rounded to the digits it shows (either way at an exact half)."""
    quoted = quoted.replace(",", "")
    digits = len(quoted.partition(".")[2])
    return abs(float(quoted) - value) <= 0.5 * 10 ** -digits + 1e-9


def template_regex(template: str) -> tuple[str, list[re.Match]]:
    """The regex of the text a template stands for (ending where the marker begins), and its
    placeholders in order."""
    def literal(words: str) -> str:  # as written, any run of white space for a space
        return r"\s+".join(re.escape(w) for w in re.split(r"\s+", words)) if words else ""
    parts, holders, at = [], [], 0
    for m in PLACEHOLDER.finditer(template):
        parts += [literal(template[at:m.start()]), rf"\**({NUMBER})\**"]
        holders.append(m)
        at = m.end()
    parts.append(literal(template[at:]))
    return r"(?<![\w.])" + "".join(parts) + r"\**\s*\Z", holders


def markers(text: str):
    """(line, marker text, file, path words, template, start of the text it covers, marker's
    start) for every source marker of a page."""
    for m in MARKER.finditer(text):
        name, rest = m.group(1), " ".join(m.group(2).split())
        path, colon, template = rest.partition(":")
        yield (text.count("\n", 0, m.start()) + 1, m.group(0), name, path.split(),
               template.strip() if colon else "{}", m.start())


def check_marker(text: str, name: str, path: list[str], template: str, end: int) -> tuple[int, str]:
    """(start of the covered text, "" or what is wrong) for one marker ending at `end`."""
    regex, holders = template_regex(template)
    before = text[max(0, end - 600):end]
    found = re.search(regex, before)
    if not found:
        return end, f"the text before it does not read {template!r}"
    begin = end - len(before) + found.start()
    try:
        node = walk(load(name), path)
    except (KeyError, IndexError, ValueError, TypeError, OSError) as e:
        return begin, f"no {' '.join(path)!r} in bench/results/{name} ({type(e).__name__}: {e})"
    wrong = []
    for quoted, holder in zip(found.groups(), holders):
        try:
            value = lookup(node, holder, isinstance(node, list))
        except (KeyError, IndexError, ValueError, TypeError) as e:
            return begin, f"{holder.group(0)}: no such value ({type(e).__name__}: {e})"
        if not near(quoted, value):
            wrong.append(f"{quoted} is not {holder.group(0)} = {value:.6g}")
    return begin, "; ".join(wrong)


def sourced(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """(problems, covered spans) of a page's markers."""
    problems, spans = [], []
    for line, said, name, path, template, start in markers(text):
        begin, problem = check_marker(text, name, path, template, start)
        if problem:
            problems.append(f"line {line}: {said}: {problem}")
        spans.append((begin, start))
    return problems, spans


def prose(text: str) -> str:
    """The page with what is not prose blanked out, positions kept: code blocks, inline code,
    HTML comments and link targets."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", blank, text)
    return re.sub(r"\]\([^)\s]*\)", lambda m: "]" + blank(m)[1:], text)


def phrase_spans(text: str, phrase: str) -> list[tuple[int, int]]:
    regex = r"\s+".join(re.escape(w) for w in phrase.split())
    return [(m.start(), m.end()) for m in re.finditer(regex, text)]


def unsourced(text: str, allowed: list[str], spans: list[tuple[int, int]],
              scope: list[tuple[int, int]] | None = None) -> tuple[list[str], list[str]]:
    """(decimals of the prose inside `scope` (the whole page if None) that no marker's span
    covers and no allowed phrase holds, allowed phrases found nowhere in the page)."""
    clean = prose(text)
    held, unused = list(spans), []
    for phrase in allowed:
        found = phrase_spans(clean, phrase)
        held += found
        if not found:
            unused.append(phrase)
    out = []
    for m in DECIMAL.finditer(clean):
        if scope is not None and not any(a <= m.start() < b for a, b in scope):
            continue
        if not any(a <= m.start() and m.end() <= b for a, b in held):
            line = text.count("\n", 0, m.start()) + 1
            context = " ".join(clean[max(0, m.start() - 40):m.end() + 20].split())
            out.append(f"line {line}: {m.group(0)} (... {context} ...)")
    return out, unused


SCOPE = re.compile(r"<!--\s*every figure sourced\s*-->")


def sourced_blocks(text: str) -> list[tuple[int, int]]:
    """The blocks a page opts into the no-unsourced-figure rule: the paragraph or list item
    that holds an `<!-- every figure sourced -->` (put it at the end of the block: a line that
    starts with an HTML comment is not Markdown any more)."""
    bounds = [0] + [m.start() + 1 for m in re.finditer(r"\n\s*\n|\n\s*(?:[-*]|\d+\.) ", text)] + [len(text)]
    out = []
    for m in SCOPE.finditer(text):
        start = max(b for b in bounds if b <= m.start())
        out.append((start, min(b for b in bounds if b > m.start())))
    return out
