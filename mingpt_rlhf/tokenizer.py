"""Tokenizers: one interface, two implementations.

Every tokenizer here has `encode(str) -> list[int]`, `decode(list[int]) -> str`, `vocab_size`
(rows a model needs), `pad_id`, `eos_id`, `bos_id` (put first in a sequence, or None),
`n_tokens` (ids from n_tokens on are model rows without a token, never to be sampled: Qwen has
151,936 rows for 151,669 tokens), `state_dict()` (the checkpoint's copy, `tokenizer_from_state`).
PAD and EOS always differ: masking out padding would otherwise mask every EOS, never learnt then.

- `WordTokenizer`: the small one for the built-in task. One id per whitespace-separated word:
  the built-in language is a few dozen words, so a demonstration (prompt, response and EOS) is
  6-19 tokens (12 at the median) instead of 20-121 characters (62): every stage trains and
  samples several times faster, and the model cannot spell a word that does not exist, which
  makes `well_formed` >= 0.95 easy to reach after a short SFT run.
- `BPETokenizer`: byte-level BPE (`machinery/bpe.py`): GPT-2's vocab.json + merges.txt, or the
  tokenizer.json of Qwen2/2.5, Qwen3, Llama 3, SmolLM2 (`machinery/tokenizer_json.py`, `machinery/chat.py`).

Try it:  python -c "from mingpt_rlhf.tokenizer import WordTokenizer as W; t=W.from_texts(['a b .']); print(t.encode('a b . <eos>'))"
"""
from __future__ import annotations

from .machinery.errors import UserError

PAD = "<pad>"
EOS = "<eos>"
UNK = "<unk>"


class WordTokenizer:
    """Whitespace word tokenizer with fixed special tokens: <pad>=0, <eos>=1, <unk>=2.

    `decode` writes EOS as the literal word "<eos>", so decoded text keeps the information
    "this response ended" (the built-in task's gold reward needs it).
    """

    def __init__(self, words: list[str]):
        specials = [PAD, EOS, UNK]
        self.itos = specials + [w for w in words if w not in specials]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        assert len(self.stoi) == len(self.itos), "duplicate words in the vocabulary"
        self.pad_id, self.eos_id, self.unk_id = 0, 1, 2
        self.bos_id = None

    @classmethod
    def from_texts(cls, texts) -> "WordTokenizer":
        """Build the vocabulary from every word in `texts` (sorted, so it is deterministic)."""
        words = sorted({w for text in texts for w in text.split()})
        return cls(words)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def n_tokens(self) -> int:
        return len(self.itos)  # every id is a word (PAD's too: it is never sampled all the same)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(w, self.unk_id) for w in text.split()]

    def decode(self, ids) -> str:
        # pads are layout, not text: drop them so decoded batches read cleanly
        return " ".join(self.itos[i] for i in ids if i != self.pad_id)

    def state_dict(self) -> dict:
        return {"type": "word", "words": self.itos[3:]}


from .machinery.bpe import BPETokenizer  # noqa: E402  (byte-level BPE, same interface)


def tokenizer_from_state(state: dict):
    """Rebuild a tokenizer saved with `tokenizer.state_dict()` (e.g. from a checkpoint)."""
    kind = state.get("type")
    if kind == "word":
        return WordTokenizer(state["words"])
    if kind == "bpe":
        return BPETokenizer.from_state(state)
    raise UserError(f"unknown tokenizer type {kind!r} in checkpoint; was it written by mingpt_rlhf?")


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers map text to the same ids (compares their saved state)."""
    return a.state_dict() == b.state_dict()
