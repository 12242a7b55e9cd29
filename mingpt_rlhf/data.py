"""Data: JSONL readers with validation, encoding with EOS, padding, and the SFT loss mask.

The JSONL files users give (demonstrations, preference pairs, prompts) are read by
`read_jsonl` and the loaders below it; its docstring gives every format.

Sequences are [BOS] + prompt + response + EOS (a BOS where the tokenizer has one). When that is
longer than the block size we cut tokens from the *left of the prompt*, after the BOS (its end,
next to the response, matters most); an example whose response alone does not fit is skipped.

Padding: SFT and the reward model pad on the right (a causal model never looks right, so
right pads change nothing before them); generation pads prompts on the left so all responses
start in the same column.
"""
from __future__ import annotations

import json
import os

import torch

from .machinery.chat import (PLAIN, ChatFormat, Conversation, chat_format_of, conversation_of,
                             pair_texts, prompt_text, transcript)
from .machinery.distributed import shard, world_size
from .machinery.errors import UserError

IGNORE = -100  # target value that cross_entropy skips
LISTS = ("turns", "messages")  # the JSONL fields that hold a list


def read_jsonl(path: str, required: list[list[str]], what: str) -> list[tuple[int, dict]]:
    """Rows of a JSONL file as (line number, object). Each object must have all the string
    fields of at least one alternative in `required`, e.g. [["prompt", "response"], ["text"]].

    File formats (one JSON object per line; blank lines are skipped):
    - SFT demonstrations (`train_sft.py --data`): {"prompt": ..., "response": ...}, or
      {"text": ...} alone (then every token is trained on), or a whole episode with an environment,
      {"turns": [{"role": "env", "text": ...}, {"role": "policy", "text": ...}, ...]}: the
      environment's opening first, then turns in any order; the loss is on the policy's turns
      only (each followed by EOS, its end-of-turn token), and each turn is tokenized on its
      own, as an episode holds it (`encode_transcript`). Or a conversation,
      {"messages": [{"role": "system" | "user" | "assistant", "content": ...}, ...]}, with at
      least one assistant message: rendered in the tokenizer's chat format (machinery/chat.py), it is
      an episode whose policy turns are the assistant's answers, so the loss is on those only.
    - Preference pairs (`train_rm.py --data`): {"prompt": ..., "chosen": ..., "rejected": ...}
      (trl's format), or {"chosen": ..., "rejected": ...} alone (raw Anthropic HH, where both
      hold the whole dialogue), or {"messages": [...], "chosen": ..., "rejected": ...}: the
      conversation so far (ending with a user or system message) and two answers to it.
    - Prompts (`train_ppo.py --prompts`): {"prompt": ...} or {"messages": [...]} (ending with a
      user or system message; rendered with the next answer's header).
    A malformed line fails with `file:line` and what is wrong (a UserError, so exit status 2).

    Empty prompts: a policy samples its first response token from the prompt's last token, so a
    prompts file refuses a prompt that is empty or only whitespace (`file:line`). Demonstrations
    and pairs may have one ({"text"} lines have none by design): the first token of a sequence
    has no position before it, so it is never a target; SFT learns the response from its second
    token on, DPO sums log-probs from the second token on (both sides alike), and the reward
    model scores the whole text as usual. Sampling on such a pair's prompt (the RM's
    normalisation, DPO's eval) skips it."""
    if not os.path.isfile(path):
        raise UserError(f"{what} file {path} does not exist; check the path")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")  # not splitlines(): JSON strings may hold U+2028
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSONL") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg}); each line must be one "
                            f"JSON object") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        fits = [alt for alt in required
                if all(isinstance(obj.get(k), list if k in LISTS else str) for k in alt)]
        if not fits:
            wanted = " or ".join("{" + ", ".join(f'"{k}": {"[...]" if k in LISTS else "str"}'
                                                 for k in alt) + "}" for alt in required)
            raise UserError(f"{path}:{n}: expected {wanted}, got keys {sorted(obj)}")
        if "messages" in obj and {"prompt", "response", "text", "turns"} & set(obj):
            raise UserError(f"{path}:{n}: give either \"messages\" or prompt / response / text / "
                            f"turns fields, not both")
        rows.append((n, obj))
    if not rows:
        raise UserError(f"{what} file {path} has no examples")
    return rows


def load_sft_jsonl(path: str) -> list:
    """Demonstrations: (prompt, response) pairs, `Transcript`s for episode lines, and
    `Conversation`s for messages lines (rendered in the tokenizer's chat format when SFTData
    encodes them: the tokenizer may not exist yet)."""
    rows = read_jsonl(path, [["prompt", "response"], ["text"], ["turns"], ["messages"]], "SFT data")
    return [(o["prompt"], o["response"]) if "response" in o else
            ("", o["text"]) if "text" in o else
            conversation_to_learn(o["messages"], f"{path}:{n}") if "messages" in o else
            transcript_of(o["turns"], f"{path}:{n}") for n, o in rows]


def conversation_to_learn(messages, where: str) -> Conversation:
    conversation = conversation_of(messages, where)
    if not any(role == "assistant" for role, _ in conversation):
        raise UserError(f"{where}: the conversation has no assistant message, nothing to learn "
                        f"from; add the answer as {{\"role\": \"assistant\", \"content\": ...}}")
    return conversation


def conversation_to_answer(messages, where: str) -> Conversation:
    """A conversation a prompt is made of: it must end before an answer."""
    conversation = conversation_of(messages, where)
    if conversation[-1][0] == "assistant":
        raise UserError(f"{where}: the conversation ends with an assistant message, but these "
                        f"messages are the prompt an answer follows; drop the last message")
    return conversation


class Transcript(list):
    """An episode's turns [(role, text), ...], role "env" or "policy", the opening first."""


def transcript_of(turns: list, where: str) -> Transcript:
    """A Transcript from a JSONL line's "turns", or a UserError at `where` (file:line)."""
    out = Transcript()
    for i, turn in enumerate(turns):
        if not (isinstance(turn, dict) and turn.get("role") in ("env", "policy")
                and isinstance(turn.get("text"), str)):
            raise UserError(f"{where}: turn {i + 1} must be {{\"role\": \"env\" or \"policy\", "
                            f"\"text\": str}}, got {str(turn)[:60]}")
        out.append((turn["role"], turn["text"]))
    if not out or out[0][0] != "env":
        raise UserError(f"{where}: an episode starts with the environment's opening "
                        f"(role \"env\"); put it first")
    if not any(role == "policy" for role, _ in out):
        raise UserError(f"{where}: the episode has no policy turn, nothing to learn from")
    return out


def load_preference_jsonl(path: str, chat: ChatFormat = PLAIN):
    """Preference pairs; a messages line is rendered in `chat` (the policy's chat format)."""
    from .task_base import PreferencePair
    rows = read_jsonl(path, [["prompt", "chosen", "rejected"], ["messages", "chosen", "rejected"],
                             ["chosen", "rejected"]], "preference data")
    return [PreferencePair(o["prompt"], o["chosen"], o["rejected"]) if "prompt" in o else
            PreferencePair(*pair_texts(chat, conversation_to_answer(o["messages"], f"{path}:{n}"),
                                       o["chosen"], o["rejected"], f"{path}:{n}"))
            if "messages" in o else split_dialogue_pair(o["chosen"], o["rejected"]) for n, o in rows]


def split_dialogue_pair(chosen: str, rejected: str, marker: str = "Assistant:"):
    """A raw Anthropic HH pair holds the whole dialogue on both sides. The prompt is their
    shared beginning up to the last "Assistant:" in it; the responses are the rest. Without
    that marker the prompt is empty and the whole texts are compared."""
    from .task_base import PreferencePair
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    cut = chosen[:n].rfind(marker)
    cut = cut + len(marker) if cut >= 0 else 0
    return PreferencePair(chosen[:cut], chosen[cut:], rejected[cut:])


def load_prompts_jsonl(path: str, chat: ChatFormat = PLAIN) -> list[str]:
    return [row["prompt"] for row in load_prompt_rows(path, chat)]


# the reward function's own arguments: a field of a prompts file may not take their names
RESERVED_FIELDS = ("prompts", "responses")


def load_prompt_rows(path: str, chat: ChatFormat = PLAIN) -> list[dict]:
    """Rows of a prompts file: {"prompt": str, ...}, a messages line rendered in `chat` (the
    policy's chat format) into its "prompt". Every other field (a reference answer, unit
    tests, ...) reaches a reward function as a keyword argument, so every row must have the
    same fields, and none may be named like the function's own arguments."""
    rows = read_jsonl(path, [["prompt"], ["messages"]], "prompts")
    for k, (n, obj) in enumerate(rows):
        if "messages" in obj:  # (read_jsonl refuses a line with "prompt" too)
            fields = {f: v for f, v in obj.items() if f != "messages"}
            conversation = conversation_to_answer(obj["messages"], f"{path}:{n}")
            rows[k] = (n, {"prompt": prompt_text(chat, conversation, f"{path}:{n}"), **fields})
    for n, obj in rows:
        if not obj["prompt"].strip():  # no token for the first response token to follow
            raise UserError(f"{path}:{n}: the prompt is empty; a policy answers a prompt of at "
                            f"least one word: write one or drop the line")
    first_line, first = rows[0]
    fields = set(first) - {"prompt"}
    for n, obj in rows:
        if set(obj) - {"prompt"} != fields:
            raise UserError(f"{path}:{n}: fields {sorted(set(obj) - {'prompt'})} differ from "
                            f"line {first_line}'s {sorted(fields)}; give every line the same "
                            f"fields (they reach the reward function as keyword arguments)")
    for name in RESERVED_FIELDS:
        if name in fields:
            raise UserError(f"{path}:{first_line}: a field may not be called {name!r} (the "
                            f"reward function's own argument); rename it")
    return [obj for _, obj in rows]


def fields_of(rows: list[dict]) -> dict[str, list]:
    """{field: one value per row} of prompt rows, "prompt" left out."""
    return {k: [row[k] for row in rows] for k in rows[0] if k != "prompt"} if rows else {}


def sequence_start(tokenizer, ids: list[int]) -> list[int]:
    """`ids` as the first ids of a sequence: the tokenizer's BOS in front where it declares one
    (Llama 3's <|begin_of_text|>, which its pretraining put before every document), unless they
    already start with it (Llama 3's chat format writes it)."""
    bos = getattr(tokenizer, "bos_id", None)
    return ids if bos is None or ids[:1] == [bos] else [bos] + ids


def encode_transcript(tokenizer, turns: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """(ids, acted) of a transcript [(role, text), ...] as an episode would hold it: each turn
    tokenized on its own, a policy turn followed by EOS and marked 1 in `acted` (the tokens SFT
    trains on), the environment's turns marked 0. The first turn is the environment's opening."""
    ids, acted = [], []
    for k, (role, text) in enumerate(turns):
        piece = tokenizer.encode(text)
        if k == 0:
            piece = sequence_start(tokenizer, piece)
        if role == "policy":
            piece = piece + [tokenizer.eos_id]
        ids += piece
        acted += [1 if role == "policy" else 0] * len(piece)
    return ids, acted


def holdout_split(items: list, seed: int, fraction: float = 0.05):
    """(train, held-out): a seeded random `fraction` (at least one item) is held out. A list of
    one item is used for both, so a tiny file still runs."""
    if len(items) < 2:
        return items, items
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = max(1, int(len(items) * fraction))
    return [items[i] for i in order[n_eval:]], [items[i] for i in order[:n_eval]]


def encode_example(tokenizer, prompt: str, response: str, block_size: int):
    """(ids, n_prompt) with ids = prompt + response + EOS (BOS first, if any), cut from the left
    of the prompt (after the BOS) to fit `block_size`; None when the response and EOS (and
    BOS) alone do not fit."""
    p = sequence_start(tokenizer, tokenizer.encode(prompt) if prompt else [])
    r = tokenizer.encode(response) + [tokenizer.eos_id]
    bos = p[:1] if getattr(tokenizer, "bos_id", None) is not None else []
    if len(bos) + len(r) > block_size:
        return None
    p = bos + p[len(bos) + max(0, len(p) + len(r) - block_size):]
    return p + r, len(p)


def encode_prompt(tokenizer, prompt: str, max_len: int) -> list[int]:
    """Prompt ids, cut from the left to at most `max_len` (> 0) tokens.

    A prompt must have a token: the first response token is sampled from the logits at the
    prompt's last one. A row with none would be sampled from a padding position, and the
    packed scoring pass (machinery/packing.py) has no position before it at all, so its stored and
    learn-time log-probs would differ."""
    assert max_len > 0, f"no room for a prompt (max_len {max_len})"
    ids = tokenizer.encode(prompt)
    if not ids:
        raise UserError(f"the prompt {prompt!r} encodes to no tokens; give every prompt at least "
                        f"one word")
    ids = sequence_start(tokenizer, ids)
    bos = ids[:1] if getattr(tokenizer, "bos_id", None) is not None else []
    keep = min(len(ids) - len(bos), max(1, max_len - len(bos)))  # the BOS stays, the end too
    return bos + ids[len(ids) - keep:]


def left_pad(rows: list[list[int]], pad_id: int):
    """Token lists -> (ids, attention_mask), both (B, T), padded on the left."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, T - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, T - len(r):] = 1
    return ids, mask


def right_pad(rows: list[list[int]], pad_id: int):
    """Token lists -> (ids, attention_mask), both (B, T), padded on the right."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


class SFTData:
    """Encoded demonstrations and the batches of next-token targets made from them."""

    def __init__(self, tokenizer, pairs, block_size: int, loss_on_prompt: bool = False):
        encoded = [self.encode(tokenizer, item, block_size) for item in pairs]
        self.examples = [e for e in encoded if e is not None]  # (ids, trained: 1 per id)
        self.skipped = len(encoded) - len(self.examples)
        if not self.examples:
            raise UserError(f"every example is longer than the block size {block_size}; "
                            f"raise --block_size")
        self.pad_id = tokenizer.pad_id
        self.loss_on_prompt = loss_on_prompt

    @staticmethod
    def encode(tokenizer, item, block_size: int):
        """(ids, trained) of a (prompt, response) pair (cut from the left of the prompt to fit)
        or a Transcript or Conversation (skipped when it does not fit: an episode cut anywhere would lose its
        opening or its end), or None when it cannot fit."""
        if isinstance(item, Conversation):  # rendered in the tokenizer's chat format
            item = Transcript(transcript(chat_format_of(tokenizer), item))
        if isinstance(item, Transcript):
            ids, acted = encode_transcript(tokenizer, item)
            return (ids, acted) if len(ids) <= block_size else None
        encoded = encode_example(tokenizer, *item, block_size)
        if encoded is None:
            return None
        ids, n_prompt = encoded
        return ids, [0] * n_prompt + [1] * (len(ids) - n_prompt)

    def __len__(self):
        return len(self.examples)

    def batch(self, indices):
        """(inputs, targets), both (B, T-1). targets[b, t] is the token at t+1 (the logit at t
        predicts the next token), or IGNORE where it is padding, or a token the policy did not
        write (a prompt's, an environment's), unless `loss_on_prompt`: the model is taught to
        answer, not to write prompts."""
        rows = [self.examples[i] for i in indices]
        ids, mask = right_pad([ids for ids, _ in rows], self.pad_id)
        targets = ids[:, 1:].clone()
        targets[mask[:, 1:] == 0] = IGNORE
        if not self.loss_on_prompt:
            trained, _ = right_pad([flags for _, flags in rows], 0)
            targets[trained[:, 1:] == 0] = IGNORE
        return ids[:, :-1], targets


class PairData:
    """Encoded preference pairs (reward model, DPO). A batch is the chosen rows, then the
    rejected rows, right-padded: (ids, attention mask, response mask), each (2B, T); the
    response mask marks the response tokens and EOS (what DPO sums log-probs over)."""

    def __init__(self, tokenizer, pairs, block_size: int):
        self.pairs = []
        for p in pairs:
            c = encode_example(tokenizer, p.prompt, p.chosen, block_size)
            r = encode_example(tokenizer, p.prompt, p.rejected, block_size)
            if c is not None and r is not None:
                self.pairs.append((c, r))
        self.skipped = len(pairs) - len(self.pairs)
        if not self.pairs:
            raise UserError(f"no preference pair fits block_size {block_size}")
        self.pad_id = tokenizer.pad_id

    def __len__(self):
        return len(self.pairs)

    def batch(self, indices):
        examples = [self.pairs[i][0] for i in indices] + [self.pairs[i][1] for i in indices]
        ids, mask = right_pad([ids for ids, _ in examples], self.pad_id)
        response = mask.clone()
        for row, (_, n_prompt) in enumerate(examples):
            response[row, :n_prompt] = 0
        return ids, mask, response


def micro_batches_of_step(n_pairs: int, step: int, seed: int, batch_size: int,
                          grad_accum: int) -> list[list[int]]:
    """This process's micro-batches (lists of pair indices) for optimizer step `step` of the
    reward model or DPO. Each epoch visits every pair once, in an order fixed by (seed, epoch);
    a step takes the next batch_size x grad_accum x processes pairs; under torchrun each
    micro-batch's batch_size x processes pairs are split over the processes."""
    world = world_size()
    per_step = batch_size * grad_accum * world
    epoch, k = divmod(step, n_pairs // per_step)
    order = torch.randperm(n_pairs, generator=torch.Generator().manual_seed(seed + epoch))
    pairs = order[k * per_step:(k + 1) * per_step].tolist()
    return [shard(pairs[i:i + batch_size * world], batch_size)
            for i in range(0, per_step, batch_size * world)]
