"""Tokenizers: one interface, two implementations.

Every tokenizer here has `encode(str) -> list[int]`, `decode(list[int]) -> str`,
`vocab_size`, `pad_id`, `eos_id`, and `state_dict()` so that it travels inside a checkpoint
(`tokenizer_from_state` rebuilds it). PAD and EOS are always different ids: if they were the
same, masking out padding would also mask out every EOS and the model would never learn to
stop. Two more say what a model built for it must know: `n_tokens`, the count of ids that
are tokens (0..n_tokens-1; a model's output rows from n_tokens on have no token, and are never
to be sampled: Qwen's embeddings have 151,936 rows for 151,669 tokens), and `bos_id`, the
token put first in every sequence (Llama 3's), or None. `vocab_size` is the number of rows
the model needs at least (the tokens and PAD).

- `WordTokenizer`: the small one for the built-in task. One id per whitespace-separated word.
  We chose words over characters because the built-in language is made of a few dozen words:
  a demonstration (prompt, response and EOS) is 6-19 tokens (12 at the median) instead of
  20-121 characters (62), so every stage trains and samples several times faster, and the
  model cannot spell a word that does not exist, which is what makes `well_formed` >= 0.95
  easy to reach after a short SFT run.
- `BPETokenizer`: byte-level BPE (see `machinery/bpe.py`), for real models: GPT-2's, from
  vocab.json + merges.txt, and today's families' (Qwen2/2.5, Qwen3, Llama 3, SmolLM2) from a
  tokenizer.json (`machinery/tokenizer_json.py`), with the chat format of their files (chat.py).

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
