"""Loading GPT-2 checkpoints: a hand-written safetensors file, a reference forward pass written
straight from the raw (Conv1D-layout) tensors, damaged files, vocab extension, and the download
cache with a fake network."""
import io
import json
import math
import os
import struct

import pytest
import torch

from mingpt_rlhf.machinery import pretrained
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.model import GPT
from mingpt_rlhf.machinery.pretrained import read_safetensors, resolve_pretrained

load_pretrained = GPT.from_pretrained  # the one way in

N_LAYER, N_EMBD, N_HEAD, VOCAB, BLOCK = 2, 32, 4, 50, 16
DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.int64: "I64", torch.int8: "I8"}


def write_safetensors(path, tensors, edit=None):
    """Our own minimal writer: header JSON (padded to 8 bytes), then the raw bytes.
    `edit(header)` may falsify the header before it is written."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if edit:
        edit(header)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def gpt2_raw(seed=0, vocab=VOCAB, prefix=""):
    """Random weights under GPT-2's published names, Conv1D weights as (in, out)."""
    g = torch.Generator().manual_seed(seed)
    C = N_EMBD
    rnd = lambda *shape, std=0.2: torch.randn(*shape, generator=g) * std
    raw = {"wte.weight": rnd(vocab, C), "wpe.weight": rnd(BLOCK, C)}
    for i in range(N_LAYER):
        h = f"h.{i}."
        raw.update({
            h + "ln_1.weight": 1 + rnd(C), h + "ln_1.bias": rnd(C),
            h + "attn.c_attn.weight": rnd(C, 3 * C), h + "attn.c_attn.bias": rnd(3 * C),
            h + "attn.c_proj.weight": rnd(C, C), h + "attn.c_proj.bias": rnd(C),
            h + "ln_2.weight": 1 + rnd(C), h + "ln_2.bias": rnd(C),
            h + "mlp.c_fc.weight": rnd(C, 4 * C), h + "mlp.c_fc.bias": rnd(4 * C),
            h + "mlp.c_proj.weight": rnd(4 * C, C), h + "mlp.c_proj.bias": rnd(C),
        })
    raw.update({"ln_f.weight": 1 + rnd(C), "ln_f.bias": rnd(C)})
    return {prefix + k: v for k, v in raw.items()}


def reference_gpt2(raw, idx, n_head=N_HEAD):
    """GPT-2's forward pass in plain tensor ops on the raw checkpoint (Conv1D: x @ W + b)."""
    w = lambda name: raw[name].float()
    B, T = idx.shape
    C = w("wte.weight").shape[1]
    hs = C // n_head

    def layer_norm(x, name):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w(name + ".weight") + w(name + ".bias")

    def heads(t):
        return t.view(B, T, n_head, hs).transpose(1, 2)

    x = w("wte.weight")[idx] + w("wpe.weight")[:T]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for i in range(len({k.split(".")[1] for k in raw if k.startswith("h.")})):
        p = f"h.{i}."
        q, k, v = (layer_norm(x, p + "ln_1") @ w(p + "attn.c_attn.weight")
                   + w(p + "attn.c_attn.bias")).split(C, dim=-1)
        att = (heads(q) @ heads(k).transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        y = (att @ heads(v)).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w(p + "attn.c_proj.weight") + w(p + "attn.c_proj.bias")
        m = layer_norm(x, p + "ln_2") @ w(p + "mlp.c_fc.weight") + w(p + "mlp.c_fc.bias")
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + m @ w(p + "mlp.c_proj.weight") + w(p + "mlp.c_proj.bias")
    return layer_norm(x, "ln_f") @ w("wte.weight").T


@pytest.fixture
def checkpoint(tmp_path):
    """A folder with model.safetensors and config.json, and the raw tensors written there."""
    raw = gpt2_raw()
    write_safetensors(tmp_path / "model.safetensors", raw)
    (tmp_path / "config.json").write_text(json.dumps({"n_head": N_HEAD}))
    return tmp_path, raw


def test_every_tensor_lands_in_place(checkpoint):
    folder, raw = checkpoint
    model = GPT.from_pretrained(str(folder))
    cfg = model.config
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd) == \
        (VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD)
    sd = model.state_dict()
    for name, t in raw.items():
        ours = sd["transformer." + name]
        expected = t.t() if name.endswith(pretrained.CONV1D) else t
        if name == "wte.weight":  # rows padded to a multiple of 64, never returned as logits
            assert ours.shape[0] == cfg.padded_vocab_size and ours.shape[0] % 64 == 0
            ours = ours[:VOCAB]
        assert torch.equal(ours, expected), name
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not model.training


def test_logits_equal_reference_forward(checkpoint):
    folder, raw = checkpoint
    model = load_pretrained(str(folder))
    idx = torch.randint(0, VOCAB, (3, BLOCK), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(idx)
    torch.testing.assert_close(ours, reference_gpt2(raw, idx), atol=1e-5, rtol=1e-5)


def test_prefix_buffers_half_precision_and_file_path(tmp_path):
    # names with "transformer.", GPT-2's mask buffers, a tied lm_head copy, fp16 and bf16 data
    raw = gpt2_raw(prefix="transformer.")
    raw = {k: v.half() if "mlp" in k else v.bfloat16() if "attn" in k else v for k, v in raw.items()}
    raw["transformer.h.0.attn.bias"] = torch.ones(1, 1, BLOCK, BLOCK).bfloat16()
    raw["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4).bfloat16()
    raw["lm_head.weight"] = raw["transformer.wte.weight"].clone()
    write_safetensors(tmp_path / "w.safetensors", raw)
    (tmp_path / "config.json").write_text(json.dumps({"n_head": N_HEAD}))
    model = load_pretrained(str(tmp_path / "w.safetensors"))
    plain = {k[len("transformer."):]: v for k, v in raw.items() if k.startswith("transformer.")}
    idx = torch.arange(BLOCK)[None] % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference_gpt2(plain, idx), atol=1e-5, rtol=1e-5)


def test_read_safetensors_roundtrip_is_memory_mapped(tmp_path):
    tensors = {"a": torch.arange(6.).view(2, 3), "b": torch.tensor([1, -2], dtype=torch.int64),
               "c": torch.randn(3).bfloat16(), "empty": torch.zeros(0, 4)}
    write_safetensors(tmp_path / "t.safetensors", tensors)
    back = read_safetensors(tmp_path / "t.safetensors")
    assert back.keys() == tensors.keys()
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k])


@pytest.mark.parametrize("damage, message", [
    ("truncate", "truncated"),
    ("short", "no safetensors header"),
    ("header_past_end", "truncated"),
    ("not_json", "not JSON"),
    ("lie", "'h.1.mlp.c_fc.weight'"),
    ("dtype", "F8_E4M3"),
])
def test_damaged_files_raise_user_error(checkpoint, damage, message):
    folder, raw = checkpoint
    path = folder / "model.safetensors"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:-100])
    elif damage == "short":
        path.write_bytes(data[:5])
    elif damage == "header_past_end":
        path.write_bytes(struct.pack("<Q", len(data)) + data[8:])
    elif damage == "not_json":
        n = struct.unpack("<Q", data[:8])[0]
        path.write_bytes(data[:8] + b"{" * n + data[8 + n:])
    elif damage == "lie":  # a shape whose byte count disagrees with the offsets
        write_safetensors(path, raw, lambda h: h["h.1.mlp.c_fc.weight"].update(shape=[N_EMBD, 129]))
    elif damage == "dtype":
        write_safetensors(path, raw, lambda h: h["wpe.weight"].update(dtype="F8_E4M3"))
    with pytest.raises(UserError, match=message) as err:
        load_pretrained(str(folder))
    assert str(path) in str(err.value)


def test_shape_that_does_not_fit_names_the_tensor(checkpoint):
    folder, raw = checkpoint
    raw["h.1.mlp.c_proj.weight"] = torch.randn(4 * N_EMBD + 4, N_EMBD)  # consistent bytes, wrong size
    write_safetensors(folder / "model.safetensors", raw)
    with pytest.raises(UserError, match="'h.1.mlp.c_proj.weight'"):
        load_pretrained(str(folder))


def test_missing_tensor_and_unknown_heads(checkpoint):
    folder, raw = checkpoint
    write_safetensors(folder / "model.safetensors", {k: v for k, v in raw.items() if k != "h.0.ln_2.bias"})
    with pytest.raises(UserError, match="h.0.ln_2.bias"):
        load_pretrained(str(folder))
    os.remove(folder / "config.json")
    with pytest.raises(UserError, match="n_head"):
        load_pretrained(str(folder))


def test_vocab_extension_keeps_old_rows_and_logits(checkpoint):
    folder, raw = checkpoint
    base = load_pretrained(str(folder))
    bigger = load_pretrained(str(folder), vocab_size=VOCAB + 3)
    wte = bigger.transformer.wte.weight
    assert wte.shape == (bigger.config.padded_vocab_size, N_EMBD) and bigger.lm_head.weight is wte
    assert torch.equal(wte[:VOCAB], raw["wte.weight"])
    torch.testing.assert_close(wte[VOCAB:VOCAB + 3], raw["wte.weight"].mean(0).expand(3, -1))
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert bigger(idx).shape == (2, 9, VOCAB + 3)  # the padded rows are not logits
        torch.testing.assert_close(bigger(idx)[..., :VOCAB], base(idx), atol=1e-6, rtol=1e-6)
    with pytest.raises(UserError, match="smaller"):
        load_pretrained(str(folder), vocab_size=VOCAB - 1)


# ---- downloading, with a fake network --------------------------------------------------------

class FakeResponse(io.BytesIO):
    """What urlopen returns: read(n), .headers, a context manager; optionally dies mid-way."""

    def __init__(self, data, length=None, fail_after=None):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data) if length is None else length)}
        self.fail_after = fail_after

    def read(self, n=-1):
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        return super().read(min(n, 1000) if n > 0 else n)  # small chunks: several reads


def serve(monkeypatch, files, calls, **fail):
    def urlopen(url, timeout=None):
        calls.append(url)
        return FakeResponse(files[url.rsplit("/", 1)[1]], **fail)
    monkeypatch.setattr("urllib.request.urlopen", urlopen)


def test_download_once_into_cache(checkpoint, tmp_path_factory, monkeypatch):
    folder, raw = checkpoint
    files = {f: (folder / f).read_bytes() for f in ("model.safetensors", "config.json")}
    files.update({"vocab.json": b"{}", "merges.txt": b"#version: 0.2\n"})
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("MINGPT_RLHF_CACHE", str(cache))
    calls = []
    serve(monkeypatch, files, calls)
    model = load_pretrained("gpt2")
    assert sorted(c.rsplit("/", 1)[1] for c in calls) == sorted(pretrained.FILES)
    assert calls[0].startswith("https://huggingface.co/gpt2/resolve/main/")
    assert sorted(os.listdir(cache / "gpt2")) == sorted(pretrained.FILES)  # no .part left
    assert torch.equal(model.transformer.wte.weight[:VOCAB], raw["wte.weight"])
    calls.clear()
    assert resolve_pretrained("gpt2") == str(cache / "gpt2") and calls == []  # cached: no network


@pytest.mark.parametrize("fail", [dict(fail_after=3000), dict(length=10**9)])
def test_interrupted_download_leaves_no_file(checkpoint, tmp_path_factory, monkeypatch, fail):
    folder, _ = checkpoint
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("MINGPT_RLHF_CACHE", str(cache))
    serve(monkeypatch, {"model.safetensors": (folder / "model.safetensors").read_bytes()}, [], **fail)
    with pytest.raises(UserError, match="by hand into a folder"):
        resolve_pretrained("gpt2", files=("model.safetensors",))
    assert os.listdir(cache / "gpt2") == []


def test_unknown_name_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a folder, a file, or one of"):
        resolve_pretrained(str(tmp_path / "nope"))


def test_parity_with_huggingface_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=N_EMBD,
                                     n_layer=N_LAYER, n_head=N_HEAD)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # HF zero-initialises biases; make them matter
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = GPT.from_pretrained(str(tmp_path))
    idx = torch.randint(0, VOCAB, (2, BLOCK))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), hf(idx).logits, atol=1e-4, rtol=1e-4)
