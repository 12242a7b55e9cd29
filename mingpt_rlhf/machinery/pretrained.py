"""Published weights -> our `GPT`: a safetensors reader (one file or shards) and writer, GPT-2's
name mapping (both ways: export.py writes our GPT back as GPT-2's files), a download cache;
today's families (Llama 3 / SmolLM2, Qwen2 / 2.5, Qwen3) are families.py's, told apart from
GPT-2 by config.json's `model_type`.

Concept. OpenAI's GPT-2 weights, as published on the Hugging Face hub ("gpt2", "gpt2-medium",
"gpt2-large", "gpt2-xl"), use the parameter names of `model.py` without the "transformer."
prefix. Four matrices per block are stored transposed: GPT-2's "Conv1D" layer computes
`x @ W + b` with W of shape (in, out), while `nn.Linear` keeps (out, in). So loading is: read
the file, rename, transpose `attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`, copy.
The sizes come from the tensor shapes; only the number of heads is not in any shape, so it
comes from `config.json` next to the weights, or from the four known sizes.

Format (safetensors): [8 bytes: N, unsigned little-endian][N bytes: JSON header][data].
The header maps each tensor name to {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...],
"data_offsets": [begin, end]}, with offsets counted from the first data byte (plus an optional
"__metadata__" entry). Data is little-endian, row-major. We memory-map the file, so a tensor is
read from disk when it is copied into the model and never held twice in memory.

A large model comes in shards: model.safetensors.index.json maps each tensor's name to the
file that holds it (model-00001-of-00002.safetensors, ...).

Every inconsistency (short file, bad JSON, an offset past the end, a shape that disagrees with
its byte count, a shard the index names but the folder lacks, a tensor the model has no place
for) raises `UserError` naming the file and the tensor, before any weight is copied: a damaged
download must never become a silently wrong, or half-loaded, model.

Try it (downloads ~550 MB once into ~/.cache/mingpt_rlhf/gpt2, or $MINGPT_RLHF_CACHE/gpt2):
    python -c "from mingpt_rlhf.model import GPT; print(GPT.from_pretrained('gpt2').num_params())"
"""
from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
import sys
import tempfile
import urllib.request

import torch
from tqdm import tqdm

from .errors import UserError

KNOWN_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
HUB_URL = "https://huggingface.co/{name}/resolve/main/{file}"
FILES = ("config.json", "vocab.json", "merges.txt", "model.safetensors")
# (n_layer, n_embd) -> n_head for gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2
KNOWN_HEADS = {(12, 768): 12, (24, 1024): 16, (36, 1280): 20, (48, 1600): 25, (6, 768): 12}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
REFETCH = "the file is damaged or not safetensors: delete it and download it again"


# ---- safetensors ---------------------------------------------------------------------------

def read_safetensors(path) -> dict[str, torch.Tensor]:
    """All tensors of a .safetensors file, as views of a memory map (copy-on-write)."""
    path = str(path)
    if sys.byteorder != "little":
        raise UserError("reading safetensors needs a little-endian machine")
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; check the path") from None
    with f:
        if size < 8:
            raise UserError(f"{path}: only {size} bytes, no safetensors header; {REFETCH}")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise UserError(f"{path}: the header claims {n} bytes but only {size - 8} follow; "
                            f"the file is truncated; {REFETCH}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path}: the header is not JSON ({e}); {REFETCH}") from None
        if not isinstance(header, dict):
            raise UserError(f"{path}: the header is not a JSON object; {REFETCH}")
        # ACCESS_COPY: a writable, private mapping, so torch.frombuffer accepts it without
        # a warning; pages are read lazily and the file on disk is never changed
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    data_start, data_len = 8 + n, size - 8 - n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        try:
            dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = all(isinstance(v, int) and v >= 0 for v in [*shape, begin, end])
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise UserError(f"{where}: malformed header entry {info!r}; {REFETCH}")
        if dtype_name not in DTYPES:
            raise UserError(f"{where}: dtype {dtype_name!r} is not supported (we read "
                            f"{', '.join(DTYPES)}); convert the file to F32, F16 or BF16")
        dtype = DTYPES[dtype_name]
        if not begin <= end <= data_len:
            raise UserError(f"{where}: bytes {begin}..{end} lie outside the {data_len} data "
                            f"bytes; the file is truncated; {REFETCH}")
        numel = math.prod(shape)
        if end - begin != numel * dtype.itemsize:
            raise UserError(f"{where}: shape {shape} of {dtype_name} needs "
                            f"{numel * dtype.itemsize} bytes but the header gives it "
                            f"{end - begin}; {REFETCH}")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(buf, dtype=dtype, count=numel,
                                             offset=data_start + begin).view(shape)
    return tensors


def write_safetensors(path, tensors: dict[str, torch.Tensor], metadata: dict | None = None,
                      dtype: torch.dtype | None = None) -> None:
    """Write `tensors` as one .safetensors file: the header (padded with spaces to a multiple
    of 8 bytes, as the reference writer pads it), then each tensor's bytes in the header's
    order. `dtype`: cast each floating tensor to it on the way. One tensor is copied at a time,
    so a model is never held twice in memory. The caller makes the write atomic."""
    if sys.byteorder != "little":
        raise UserError("writing safetensors needs a little-endian machine")
    cast = lambda t: t.to(dtype) if dtype is not None and t.is_floating_point() else t
    header, offset = {"__metadata__": metadata} if metadata else {}, 0
    for name, t in tensors.items():
        kind = dtype if dtype is not None and t.is_floating_point() else t.dtype
        size = t.numel() * kind.itemsize
        header[name] = {"dtype": DTYPE_NAMES[kind], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for t in tensors.values():
            f.write(cast(t.detach()).cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


def read_weights(folder: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a folder's model.safetensors, or of the shards its
    model.safetensors.index.json names: (name -> tensor, name -> the file it is in)."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        tensors = read_safetensors(single)
        return tensors, dict.fromkeys(tensors, single)
    if not os.path.isfile(index):
        raise UserError(f"no model.safetensors (nor model.safetensors.index.json and its shards) "
                        f"in {folder}; put the weights there in safetensors format "
                        f"(pytorch_model.bin is not read)")
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        ok = isinstance(weight_map, dict) and all(
            isinstance(v, str) and os.path.basename(v) == v for v in weight_map.values())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UserError(f"{index}: not a shard index (a JSON object whose \"weight_map\" maps "
                        f"each tensor to a file in this folder); {REFETCH}")
    tensors, files = {}, {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            raise UserError(f"{index} names the shard {shard}, which is not in {folder}; "
                            f"download every file the index names")
        for name, t in read_safetensors(path).items():
            if name in tensors:
                raise UserError(f"{path} and {files[name]} both hold {name!r}; {REFETCH}")
            tensors[name], files[name] = t, path
    for name, shard in weight_map.items():
        if files.get(name) != os.path.join(folder, shard):
            raise UserError(f"{index} puts {name!r} in {shard}, which does not hold it; {REFETCH}")
    return tensors, files


def read_config(folder: str) -> dict:
    """The folder's config.json as a dict ({} when there is none)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            hparams = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    if not isinstance(hparams, dict):
        raise UserError(f"{path} must be a JSON object; fix or delete it")
    return hparams


def pretrained_weights(name_or_path, vocab_size: int | None = None) -> tuple[dict, dict, dict, str]:
    """What `GPT.from_pretrained` builds a model from: (GPTConfig fields, tensors by our
    parameter names, the checkpoint's name of each, where they were read). A tensor stacked
    from several (a family's q, k, v into c_attn) is the list of its parts. GPT-2 unless
    config.json names one of today's families (families.py). `vocab_size`: the tokenizer's
    ids, the columns of the logits; by default the folder's tokenizer's for a family, the
    embedding's rows for GPT-2."""
    from .families import family_config, is_family, rename, tokenizer_id_count
    path = os.path.expanduser(str(name_or_path))
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    hparams = read_config(folder) if os.path.exists(path) else {}
    if not is_family(hparams):
        return gpt2_weights(name_or_path, vocab_size)
    raw, files = read_weights(folder) if os.path.isdir(path) else (read_safetensors(path), {})
    where = os.path.join(folder, "config.json")
    config = family_config(hparams, where, vocab_size or tokenizer_id_count(folder))
    tensors, source = rename(raw, config, where, lambda name: files.get(name, path))
    return config, tensors, source, folder


# ---- GPT-2 names and sizes -------------------------------------------------------------------

def gpt2_to_ours(raw: dict[str, torch.Tensor], path: str) -> tuple[dict, dict]:
    """Rename a GPT-2 checkpoint to our parameter names, transposing the Conv1D weights.

    Returns (tensors by our name, checkpoint name by our name) - the second for error messages.
    """
    tensors, source = {}, {}
    for name, t in raw.items():
        short = name[len("transformer."):] if name.startswith("transformer.") else name
        # h.N.attn.bias / masked_bias are GPT-2's causal-mask buffers: constants, not weights
        if re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", short):
            continue
        if short == "lm_head.weight":
            # tied to wte in GPT-2; an untied copy would be dropped silently, so check it
            wte = raw.get("wte.weight", raw.get("transformer.wte.weight"))
            if wte is None or not torch.equal(t, wte):
                raise UserError(f"{path}: lm_head.weight differs from wte.weight; our GPT ties "
                                "the two, so this checkpoint cannot be loaded exactly")
            continue
        if short.endswith(CONV1D) and t.dim() == 2:
            t = t.t()  # Conv1D (in, out) -> Linear (out, in)
        tensors["transformer." + short] = t
        source["transformer." + short] = name
    return tensors, source


def ours_to_gpt2(state: dict, config, rows: int) -> dict:
    """`gpt2_to_ours` backwards, for an export (run/export.py): our state dict of GPT-2's
    layout under the names transformers' GPT2LMHeadModel saves, the Conv1D weights transposed
    back to (in, out), the embedding cut to its first `rows`. The output layer is the
    embedding (tied), so it is not written. A model without biases (`bias=False`) gets zero
    biases, which compute the same: GPT-2's layers all have one."""
    tensors = {}
    for name, t in state.items():
        if name == "lm_head.weight":
            continue
        tensors[name] = t[:rows] if name == "transformer.wte.weight" else \
            t.t() if name.endswith(CONV1D) else t
        bias = name.removesuffix("weight") + "bias"
        if name.endswith("weight") and "wte" not in name and "wpe" not in name and bias not in state:
            tensors[bias] = torch.zeros(len(t), dtype=t.dtype)  # (out,) of a Linear, (C,) of a LayerNorm
    return tensors


def gpt2_hparams(config, rows: int) -> dict:
    """config.json of GPT-2's layout (GPT2LMHeadModel) for a GPTConfig: `gpt2_config`
    backwards, with the keys `gpt2_config` checks written as our GPT computes them."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": rows,
            "n_positions": config.block_size, "n_embd": config.n_embd, "n_layer": config.n_layer,
            "n_head": config.n_head, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": config.dropout,
            "embd_pdrop": config.dropout, "attn_pdrop": config.dropout, "tie_word_embeddings": True}


def gpt2_config(tensors: dict, hparams: dict, path: str, vocab_size: int | None) -> dict:
    """GPTConfig's fields from the tensor shapes (+ n_head from config.json or the known sizes)."""
    wte, wpe = tensors.get("transformer.wte.weight"), tensors.get("transformer.wpe.weight")
    if wte is None or wpe is None:
        raise UserError(f"{path}: no wte.weight / wpe.weight; is this a GPT-2 checkpoint?")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    n_layer, n_embd = len(layers), wte.shape[1]
    if layers != set(range(n_layer)):
        raise UserError(f"{path}: blocks {sorted(set(range(max(layers) + 1)) - layers)} are "
                        f"missing; {REFETCH}")
    n_head = hparams.get("n_head") or KNOWN_HEADS.get((n_layer, n_embd))
    if n_head is None:
        raise UserError(f"{path}: cannot tell the number of heads of a {n_layer}-layer, "
                        f"{n_embd}-wide GPT-2; put a config.json with \"n_head\" next to it")
    if not isinstance(n_head, int) or n_head < 1 or n_embd % n_head:
        raise UserError(f"{path}: n_head {n_head!r} does not divide n_embd {n_embd}; "
                        "fix config.json")
    # model.py implements exactly GPT-2's block; a variant would load but compute other logits
    act = hparams.get("activation_function", "gelu_new")
    eps = hparams.get("layer_norm_epsilon", 1e-5)
    if act not in ("gelu_new", "gelu_pytorch_tanh") or abs(eps - 1e-5) > 1e-9 or \
            hparams.get("scale_attn_by_inverse_layer_idx") or hparams.get("reorder_and_upcast_attn"):
        raise UserError(f"{path}: config.json describes a GPT-2 variant (activation {act!r}, "
                        f"layer_norm_epsilon {eps}, ...) that our GPT does not implement")
    V = wte.shape[0]
    if vocab_size is not None and vocab_size < V:
        raise UserError(f"vocab_size {vocab_size} is smaller than the checkpoint's {V}; "
                        f"pass vocab_size >= {V} (e.g. the tokenizer's vocab_size)")
    return dict(vocab_size=vocab_size or V, block_size=wpe.shape[0], n_layer=n_layer,
                n_head=n_head, n_embd=n_embd, dropout=0.0, bias=True)


def gpt2_weights(name_or_path, vocab_size: int | None = None) -> tuple[dict, dict, dict, str]:
    """GPT-2 weights as our GPT needs them: (GPTConfig fields, tensors by our parameter names,
    the checkpoint's name of each, the weights file). `name_or_path`: a folder holding
    model.safetensors (and maybe config.json), a .safetensors file, or a name from KNOWN_NAMES.
    `GPT.from_pretrained` builds the model from them (this module knows no GPT)."""
    if os.path.isfile(str(name_or_path)):
        weights = str(name_or_path)
        folder = os.path.dirname(os.path.abspath(weights))
        raw = read_safetensors(weights)
    else:
        folder = resolve_pretrained(name_or_path)
        raw, files = read_weights(folder)
        weights = files[next(iter(files))] if len(set(files.values())) == 1 else folder
    hparams = read_config(folder)
    tensors, source = gpt2_to_ours(raw, weights)
    return gpt2_config(tensors, hparams, weights, vocab_size), tensors, source, weights


def copy_weights(params: dict, tensors: dict, source: dict, weights: str) -> None:
    """Copy the checkpoint's `tensors` (by our names) into a model's `params` (name ->
    Parameter). Every tensor's place, shape and dtype is checked before the first is copied, so
    a bad checkpoint leaves nothing half-loaded. A list is the parts of a stacked matrix (a
    family's q, k, v in c_attn), copied one below the other. An embedding (or an untied output
    layer) with more rows than the checkpoint's - our BPE's PAD (id 50257 for GPT-2), the
    padding to a multiple of 64 - gets its new rows set to the mean of the others, so a new
    token starts as an "average" token; the old rows, and so the logits of old ids, are unchanged."""
    for ours in tensors:
        if ours not in params:
            raise UserError(f"{weights}: tensor {source[ours]!r} has no place in our GPT; the "
                            f"weights do not match the model config.json describes")
    plan = []
    for name, p in params.items():
        src = tensors.get(name)
        if src is None:
            raise UserError(f"{weights}: no tensor for {name.removeprefix('transformer.')}; "
                            f"the checkpoint is incomplete; {REFETCH}")
        parts = src if isinstance(src, list) else [src]
        if not all(t.is_floating_point() for t in parts):
            raise UserError(f"{weights}: tensor {source[name]!r} is {parts[0].dtype}, not a float "
                            f"(a quantized model?); we read float32, float16 and bfloat16 weights")
        rows = sum(len(t) for t in parts)
        grows = name in ("transformer.wte.weight", "lm_head.weight") and rows < len(p)
        if (len(p) if grows else rows, *parts[0].shape[1:]) != tuple(p.shape):
            hint = " (after transposing Conv1D)" if name.endswith(CONV1D) else ""
            raise UserError(f"{weights}: tensor {source[name]!r} has shape "
                            f"{(rows, *parts[0].shape[1:])}{hint}, the model needs "
                            f"{tuple(p.shape)}; the checkpoint is inconsistent; {REFETCH}")
        plan.append((p, parts, rows))
    with torch.no_grad():
        for p, parts, rows in plan:
            start = 0
            for t in parts:
                p[start:start + len(t)].copy_(t)
                start += len(t)
            if rows < len(p):
                p[rows:].copy_(p[:rows].float().mean(0, keepdim=True).expand(len(p) - rows, -1))


# ---- names -> a local folder, downloading once -----------------------------------------------

def cache_dir() -> str:
    return os.environ.get("MINGPT_RLHF_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "mingpt_rlhf")


def resolve_pretrained(name_or_path, files=FILES) -> str:
    """The local folder for `name_or_path`, downloading the missing `files` of a known name.

    An existing folder (or a file's folder) is used as it is, with no network, even when it is
    called "gpt2"; a name is looked up in `cache_dir()/<name>` and fetched once from the hub.
    """
    path = os.path.expanduser(str(name_or_path))
    if os.path.isdir(path):
        return path
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    if path not in KNOWN_NAMES:
        raise UserError(f"{name_or_path!r} is not a folder, a file, or one of "
                        f"{', '.join(KNOWN_NAMES)}; check the path")
    folder = os.path.join(cache_dir(), path)
    os.makedirs(folder, exist_ok=True)
    for file in files:
        if not os.path.isfile(os.path.join(folder, file)):
            download(HUB_URL.format(name=path, file=file), os.path.join(folder, file))
    return folder


def download(url: str, dest: str) -> None:
    """Fetch `url` into `dest` atomically: a `.part` file is renamed only once complete, so an
    interrupted download leaves nothing that a later run would take for the real file."""
    fd, part = tempfile.mkstemp(dir=os.path.dirname(dest),
                                prefix=os.path.basename(dest) + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            got = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(dest)) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            if total is not None and got != total:
                raise OSError(f"connection closed after {got} of {total} bytes")
        os.replace(part, dest)
    except BaseException as e:
        os.remove(part)
        if not isinstance(e, Exception):
            raise  # Ctrl-C stays Ctrl-C
        raise UserError(f"could not download {url} ({e}); download model.safetensors, "
                        "config.json, vocab.json and merges.txt by hand into a folder and pass "
                        "that folder instead of the name") from None
