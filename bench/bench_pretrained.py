"""Loading GPT-2-sized weights, and GPT-2 BPE encoding speed.

1. **Load**: writes a gpt2-shaped checkpoint (124M parameters: 12 layers, 768 wide, vocab
   50257, block 1024; random fp32 weights, GPT-2's names and Conv1D layout) as safetensors
   into a temporary folder, then times `GPT.from_pretrained(folder)` (median of `runs`; the
   first run also pays one-time imports of torch's "meta" device, ~1 s), and the parts:
   mapping the file (`read_safetensors`), and building a randomly initialised GPT, which
   `from_pretrained` avoids by building on the meta device.
2. **BPE**: ~1 MB of varied text (Python's own standard library sources, then generated
   sentences in several scripts with numbers, emoji, contractions and odd whitespace). A tiny
   BPE trainer below learns `merges` merges from that text, so the tokenizer does the work of a
   real one; we time `encode` over the whole text with an empty word cache (a first pass over
   new data) and again with a warm one. `--gpt2_dir` adds the same measure with GPT-2's
   published vocab.json / merges.txt from that folder.

Prints one JSON line and writes it to bench/results/pretrained.json.

    python bench/bench_pretrained.py
    python bench/bench_pretrained.py --gpt2_dir ~/.cache/mingpt_rlhf/gpt2 --runs 5
"""
from __future__ import annotations

import glob
import heapq
import json
import os
import random
import statistics
import struct
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mingpt_rlhf.machinery.bpe import EOT, BPETokenizer, byte_to_unicode, fuse_pair, gpt2_pattern  # noqa: E402
from mingpt_rlhf.machinery.cli import opt, run  # noqa: E402
from mingpt_rlhf.machinery.errors import UserError  # noqa: E402
from mingpt_rlhf.model import GPT  # noqa: E402
from mingpt_rlhf.machinery.pretrained import read_safetensors  # noqa: E402


@dataclass
class Config:
    runs: int = opt(3, "timed loads; the median is reported")
    text_kb: int = opt(1024, "size of the BPE benchmark text in KB")
    merges: int = opt(4000, "merges the tiny trainer learns from the text")
    gpt2_dir: str = opt("", "folder with GPT-2's vocab.json + merges.txt to time as well")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)")
    out: str = opt("bench/results/pretrained.json", "where the JSON result is written")


def write_gpt2_checkpoint(path, n_layer=12, n_embd=768, vocab=50257, block=1024):
    """Random weights under GPT-2's published names and layout, as safetensors. Returns bytes."""
    C = n_embd
    shapes = {"wte.weight": (vocab, C), "wpe.weight": (block, C)}
    for i in range(n_layer):
        h = f"h.{i}."
        shapes.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                       h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                       h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                       h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                       h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                       h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * torch.Size(shape).numel()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    gen = torch.Generator().manual_seed(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for shape in shapes.values():
            f.write((torch.randn(shape, generator=gen) * 0.02).numpy().tobytes())
    return 8 + len(head) + offset


def bench_text(n_bytes: int) -> str:
    """~n_bytes of text: 60% stdlib sources (code, comments, English docstrings), then seeded
    generated sentences in several scripts."""
    parts, size = [], 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        size += len(parts[-1].encode())
        if size > 0.6 * n_bytes:
            break
    words = ("the of and to a in is it's don't we'll they're I'm café naïve résumé Straße "
             "Ελληνικά μήνυμα русский текст 東京 晴れ 日本語 中文 한국어 😀 👍🏽 🎉 "
             "12 3.14 1,000 2024-06-01 $99 x² ½ #tag @user e-mail https://example.org/a?b=1").split()
    seps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", "! ", "? ", " - ", EOT]
    rng = random.Random(0)
    while size < n_bytes:
        line = "".join(rng.choice(words) + rng.choice(seps) for _ in range(rng.randint(5, 30)))
        parts.append(line)
        size += len(line.encode())
    return "\n".join(parts)


def train_bpe(text: str, n_merges: int) -> BPETokenizer:
    """A tiny GPT-2-style BPE trainer: count adjacent pairs inside pre-tokenised words, merge the
    most frequent, repeat. Pair counts are updated only for words that contain the merged pair,
    and a heap with stale entries skipped finds the next best pair."""
    b2u = byte_to_unicode()
    counts = Counter(gpt2_pattern().findall(text.replace(EOT, " ")))
    words = [[b2u[b] for b in w.encode()] for w in counts]
    freq = list(counts.values())
    pairs, where = Counter(), defaultdict(set)
    for i, s in enumerate(words):
        for p in zip(s, s[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < n_merges:
        n, best = heapq.heappop(heap)
        if -n != pairs.get(best, 0) or -n < 2:
            continue  # stale entry (count changed since it was pushed) or too rare
        merges.append(best)
        changed = set()
        for i in where.pop(best):
            s = words[i]
            for p in zip(s, s[1:]):
                pairs[p] -= freq[i]
                changed.add(p)
            new = fuse_pair(s, best)  # the same fusing that encode does
            for p in zip(new, new[1:]):
                pairs[p] += freq[i]
                where[p].add(i)
                changed.add(p)
            words[i] = new
        for p in changed:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
    tokens = list(dict.fromkeys([*b2u.values(), *(a + b for a, b in merges), EOT]))
    return BPETokenizer({t: i for i, t in enumerate(tokens)}, merges)


def time_encode(tok: BPETokenizer, text: str) -> dict:
    tok.cache.clear()
    start = time.perf_counter()
    ids = tok.encode(text)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    tok.encode(text)
    warm = time.perf_counter() - start
    assert tok.decode(ids) == text, "BPE round trip failed"
    return {"merges": len(tok.merges), "tokens": len(ids),
            "bytes_per_token": round(len(text.encode()) / len(ids), 2),
            "tokens_per_s_cold": round(len(ids) / cold), "tokens_per_s_warm": round(len(ids) / warm),
            "mb_per_s_cold": round(len(text.encode()) / cold / 1e6, 3)}


def main(cfg: Config) -> dict:
    if cfg.runs < 1 or cfg.text_kb < 1 or cfg.merges < 0:
        raise UserError("--runs and --text_kb must be >= 1, --merges >= 0")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    result = {"bench": "pretrained", "config": asdict(cfg)}

    with tempfile.TemporaryDirectory() as folder:
        file_bytes = write_gpt2_checkpoint(os.path.join(folder, "model.safetensors"))
        loads = []
        for run_i in range(cfg.runs):
            if run_i:
                del model  # one model alive at a time, as in a real script
            start = time.perf_counter()
            model = GPT.from_pretrained(folder)
            loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        read_safetensors(os.path.join(folder, "model.safetensors"))
        mapped = time.perf_counter() - start
        start = time.perf_counter()
        GPT(model.config)
        init = time.perf_counter() - start
        result["load"] = {"params": model.num_params(), "file_mb": round(file_bytes / 1e6, 1),
                          "from_pretrained_s_median": round(statistics.median(loads), 3),
                          "runs_s": [round(t, 3) for t in loads],
                          "read_safetensors_s": round(mapped, 4), "random_init_gpt_s": round(init, 3)}
        del model

    start = time.perf_counter()
    gpt2_pattern()
    result["pattern_build_s"] = round(time.perf_counter() - start, 3)  # once per process
    text = bench_text(cfg.text_kb * 1024)
    start = time.perf_counter()
    tok = train_bpe(text, cfg.merges)
    result["bpe_train_s"] = round(time.perf_counter() - start, 2)
    result["text_mb"] = round(len(text.encode()) / 1e6, 3)
    result["bpe_trained"] = time_encode(tok, text)
    if cfg.gpt2_dir:
        result["bpe_gpt2"] = time_encode(BPETokenizer.from_pretrained(cfg.gpt2_dir), text)
    result.update(torch=torch.__version__, threads=torch.get_num_threads(),
                  python=sys.version.split()[0])

    os.makedirs(os.path.dirname(cfg.out) or ".", exist_ok=True)
    with open(cfg.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run(main, Config)
