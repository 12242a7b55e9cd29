"""Today's families -> our GPT: Llama 3 (and SmolLM / SmolLM2, which use Llama's layout),
Qwen2 / Qwen2.5 and Qwen3, read from a Hugging Face folder.

Concept. These families are GPT-2's block with a few parts swapped (model.py, the end of the
file; docs/families.md). A family here is two things:
- a **configuration mapping**: config.json's keys -> GPTConfig's fields (`family_config`),
  with the reference implementation's default for each key a file may leave out, and a
  refusal for every feature that is switched on and that our GPT does not implement (a
  sliding window, mixture-of-experts layers, a rope scaling other than none or "llama3",
  biases on Llama's projections, ...): such a model would load and compute other logits;
- a **table of weight names** (`WEIGHT_NAMES`): the checkpoint's name of each tensor -> ours.
  The three families name their tensors alike; which of them a file holds (Qwen2's q/k/v
  biases, Qwen3's q/k norms, an untied `lm_head`) follows from its configuration, and a
  tensor the configured model has no place for is refused. q_proj, k_proj and v_proj are
  stacked into our c_attn, gate_proj and up_proj into c_fc (one matmul each).
The same two, read backwards, write our GPT as such a folder (`family_hparams`,
`ours_to_family`; run/export.py).

The embedding. `vocab_size` in config.json is the embedding's rows; the tokenizer may have
fewer ids (Qwen: 151,936 rows, 151,665 ids in Qwen2.5's tokenizer and 151,669 in Qwen3's). Our
GPTConfig.vocab_size is the number of ids the tokenizer has (the columns `logits()` returns,
so the only ids that can be sampled), and `embedding_rows` keeps the file's rows. Which token
pads: the first id no token has, `vocab_size` of the tokenizer's ids, in every family - for
Qwen a row the file already has, for Llama 3, SmolLM2 and GPT-2 a new row, set to the mean
embedding as GPT-2's PAD is (`pretrained.copy_weights`). It is never sampled (sampling.py).

Try it:  python -c "from mingpt_rlhf.machinery.families import WEIGHT_NAMES; print(*WEIGHT_NAMES.items(), sep='\\n')"
"""
from __future__ import annotations

import json
import os
import re

import torch

from .errors import UserError

# model_type -> what its blocks have beyond Llama's (attention biases, q/k norms) and the
# default of each key the reference implementation fills in when config.json leaves it out
FAMILIES = {
    "llama": dict(qkv_bias=False, qk_norm=False, head_dim=None, max_position_embeddings=2048),
    "qwen2": dict(qkv_bias=True, qk_norm=False, head_dim=None, max_position_embeddings=32768),
    "qwen3": dict(qkv_bias=False, qk_norm=True, head_dim=128, max_position_embeddings=32768),
}
DEFAULTS = dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                hidden_act="silu")
ROPE_SCALINGS = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# the checkpoint's name (N: a block's number) -> (our name, part): a part i is the i-th block
# of rows of a stacked matrix (q, k, v in c_attn; gate, up in c_fc), None a whole tensor
WEIGHT_NAMES = {
    "embed_tokens.weight": ("transformer.wte.weight", None),
    "layers.N.input_layernorm.weight": ("transformer.h.N.ln_1.weight", None),
    "layers.N.self_attn.q_proj.weight": ("transformer.h.N.attn.c_attn.weight", 0),
    "layers.N.self_attn.k_proj.weight": ("transformer.h.N.attn.c_attn.weight", 1),
    "layers.N.self_attn.v_proj.weight": ("transformer.h.N.attn.c_attn.weight", 2),
    "layers.N.self_attn.q_proj.bias": ("transformer.h.N.attn.c_attn.bias", 0),   # Qwen2
    "layers.N.self_attn.k_proj.bias": ("transformer.h.N.attn.c_attn.bias", 1),   # Qwen2
    "layers.N.self_attn.v_proj.bias": ("transformer.h.N.attn.c_attn.bias", 2),   # Qwen2
    "layers.N.self_attn.q_norm.weight": ("transformer.h.N.attn.q_norm.weight", None),  # Qwen3
    "layers.N.self_attn.k_norm.weight": ("transformer.h.N.attn.k_norm.weight", None),  # Qwen3
    "layers.N.self_attn.o_proj.weight": ("transformer.h.N.attn.c_proj.weight", None),
    "layers.N.post_attention_layernorm.weight": ("transformer.h.N.ln_2.weight", None),
    "layers.N.mlp.gate_proj.weight": ("transformer.h.N.mlp.c_fc.weight", 0),
    "layers.N.mlp.up_proj.weight": ("transformer.h.N.mlp.c_fc.weight", 1),
    "layers.N.mlp.down_proj.weight": ("transformer.h.N.mlp.c_proj.weight", None),
    "norm.weight": ("transformer.ln_f.weight", None),
    "lm_head.weight": ("lm_head.weight", None),  # untied output layers only
}
# what an export writes beyond the shapes (export.py): the class transformers builds, and the
# features that family's config.json could switch on, written as off
WRITTEN = {
    "llama": ("LlamaForCausalLM", dict(attention_bias=False, mlp_bias=False)),
    "qwen2": ("Qwen2ForCausalLM", dict(use_sliding_window=False)),
    "qwen3": ("Qwen3ForCausalLM", dict(attention_bias=False, use_sliding_window=False)),
}
# constants some checkpoints carry (older saves): the rotary frequencies, computed here instead
SKIPPED = re.compile(r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def is_family(hparams: dict) -> bool:
    """Whether config.json names a model type other than GPT-2's (GPT-2 folders may have no
    model_type at all)."""
    return hparams.get("model_type", "gpt2") != "gpt2"


def family_config(hparams: dict, where: str, vocab_size: int | None) -> dict:
    """GPTConfig's fields from a config.json of one of FAMILIES. `vocab_size`: the tokenizer's
    ids (None: the embedding's rows). UserError for an unknown family, a missing key, or a
    feature switched on that our GPT does not implement."""
    family = hparams.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{where}: model_type {family!r} is not a family our GPT implements "
                        f"(gpt2, {', '.join(FAMILIES)}); convert the model or pick another")
    refuse_unimplemented(hparams, family, where)
    known = {**DEFAULTS, **FAMILIES[family]}

    def get(key, kind=int):
        value = hparams[key] if key in hparams and hparams[key] is not None else known.get(key)
        if value is None:
            raise UserError(f"{where}: config.json has no {key!r}; is it a complete "
                            f"{family} configuration?")
        if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool) or \
                (kind is int and value < 1):
            raise UserError(f"{where}: {key} is {value!r}, not a valid "
                            f"{getattr(kind, '__name__', 'number')}; fix config.json")
        return value

    n_embd, n_head = get("hidden_size"), get("num_attention_heads")
    n_kv_head = hparams.get("num_key_value_heads") or n_head
    head_dim = hparams.get("head_dim") or FAMILIES[family]["head_dim"] or n_embd // n_head
    if not isinstance(n_kv_head, int) or n_head % n_kv_head:
        raise UserError(f"{where}: {n_head} attention heads are not a multiple of "
                        f"num_key_value_heads {n_kv_head!r}; fix config.json")
    rows = get("vocab_size")
    if vocab_size is not None and vocab_size < 1:
        raise UserError(f"vocab_size must be positive, got {vocab_size}")
    return dict(
        vocab_size=vocab_size or rows, embedding_rows=rows,
        block_size=get("max_position_embeddings"), n_layer=get("num_hidden_layers"),
        n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, n_embd=n_embd, dropout=0.0,
        bias=False, qkv_bias=FAMILIES[family]["qkv_bias"], qk_norm=FAMILIES[family]["qk_norm"],
        rms_norm_eps=float(get("rms_norm_eps", (int, float))), mlp_hidden=get("intermediate_size"),
        tie_embeddings=get("tie_word_embeddings", bool), **rope(hparams, where))


def rope(hparams: dict, where: str) -> dict:
    """rope_theta and rope_scaling, from transformers 5's `rope_parameters` or the older
    `rope_theta` + `rope_scaling` that published config.json files hold."""
    params = hparams.get("rope_parameters") or hparams.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UserError(f"{where}: rope_parameters / rope_scaling must be a JSON object; fix config.json")
    theta = params.get("rope_theta", hparams.get("rope_theta", DEFAULTS["rope_theta"]))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_SCALINGS:
        raise UserError(f"{where}: rope scaling {kind!r} is not implemented (ours: none or "
                        f"\"llama3\"); use a model without it")
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise UserError(f"{where}: rope_theta {theta!r} must be a positive number; fix config.json")
    if kind == "default":
        return dict(rope_theta=float(theta), rope_scaling=None)
    scaling = {key: params.get(key) for key in LLAMA3_KEYS}
    scaling["original_max_position_embeddings"] = scaling["original_max_position_embeddings"] \
        or hparams.get("max_position_embeddings")
    if not all(isinstance(v, (int, float)) and v > 0 for v in scaling.values()) or \
            scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise UserError(f"{where}: llama3 rope scaling needs positive {', '.join(LLAMA3_KEYS)} "
                        f"(high_freq_factor > low_freq_factor), got {scaling}; fix config.json")
    return dict(rope_theta=float(theta), rope_scaling={k: float(v) for k, v in scaling.items()})


def refuse_unimplemented(hparams: dict, family: str, where: str) -> None:
    """UserError for a feature that is switched on and that our GPT lacks. A key merely present
    is fine: Qwen's config.json files carry `sliding_window` with `use_sliding_window` false."""
    fix = "our GPT does not implement it (it would compute other logits); use a model without it"
    if hparams.get("use_sliding_window") or any(
            kind != "full_attention" for kind in hparams.get("layer_types") or []):
        raise UserError(f"{where}: sliding-window attention is switched on; {fix}")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if hparams.get(key):
            raise UserError(f"{where}: {key} = {hparams[key]} (a mixture of experts); {fix}")
    if family != "qwen2" and hparams.get("attention_bias"):
        raise UserError(f"{where}: attention_bias is true (biases on q, k, v and o); {fix}")
    if hparams.get("mlp_bias"):
        raise UserError(f"{where}: mlp_bias is true; {fix}")
    if hparams.get("hidden_act", "silu") != "silu":
        raise UserError(f"{where}: hidden_act {hparams['hidden_act']!r} (ours is SwiGLU's "
                        f"\"silu\"); {fix}")
    if hparams.get("partial_rotary_factor", 1.0) != 1.0:
        raise UserError(f"{where}: partial_rotary_factor {hparams['partial_rotary_factor']} "
                        f"(rotary positions on part of each head); {fix}")


def rename(raw: dict, config: dict, where: str, file_of) -> tuple[dict, dict]:
    """The checkpoint's tensors under our names: (our name -> tensor, or a list of the parts
    stacked into it, in order; our name -> the checkpoint's name(s), for messages). Every
    tensor's shape is checked against what the configuration says. `file_of(name)`: the file
    a tensor is in."""
    C, hs, H = config["n_embd"], config["head_dim"], config["mlp_hidden"]
    q, kv = config["n_head"] * hs, config["n_kv_head"] * hs
    rows = config["embedding_rows"]
    shapes = {  # by the table's name: the shape the configuration gives it
        "embed_tokens.weight": (rows, C), "lm_head.weight": (rows, C), "norm.weight": (C,),
        "layers.N.input_layernorm.weight": (C,), "layers.N.post_attention_layernorm.weight": (C,),
        "layers.N.self_attn.q_proj.weight": (q, C), "layers.N.self_attn.k_proj.weight": (kv, C),
        "layers.N.self_attn.v_proj.weight": (kv, C), "layers.N.self_attn.q_proj.bias": (q,),
        "layers.N.self_attn.k_proj.bias": (kv,), "layers.N.self_attn.v_proj.bias": (kv,),
        "layers.N.self_attn.q_norm.weight": (hs,), "layers.N.self_attn.k_norm.weight": (hs,),
        "layers.N.self_attn.o_proj.weight": (C, q), "layers.N.mlp.gate_proj.weight": (H, C),
        "layers.N.mlp.up_proj.weight": (H, C), "layers.N.mlp.down_proj.weight": (C, H),
    }
    lacks = {  # what the configured model has no place for
        "layers.N.self_attn.q_proj.bias": not config["qkv_bias"],
        "layers.N.self_attn.k_proj.bias": not config["qkv_bias"],
        "layers.N.self_attn.v_proj.bias": not config["qkv_bias"],
        "layers.N.self_attn.q_norm.weight": not config["qk_norm"],
        "layers.N.self_attn.k_norm.weight": not config["qk_norm"],
        "lm_head.weight": config["tie_embeddings"],
    }
    embedding = raw.get("model.embed_tokens.weight", raw.get("embed_tokens.weight"))
    tensors, source = {}, {}
    for name, t in raw.items():
        if SKIPPED.fullmatch(name):
            continue
        short = name[len("model."):] if name.startswith("model.") else name
        match = re.fullmatch(r"layers\.(\d+)\.(.+)", short)
        key = f"layers.N.{match.group(2)}" if match else short
        if key == "lm_head.weight" and config["tie_embeddings"] and embedding is not None \
                and torch.equal(t, embedding):
            continue  # a tied output layer saved twice: the embedding is all we need
        if key not in WEIGHT_NAMES or lacks.get(key) or (match and int(match.group(1)) >= config["n_layer"]):
            raise UserError(f"{file_of(name)}: tensor {name!r} has no place in the model "
                            f"config.json describes ({config['n_layer']} layers, q/k/v biases "
                            f"{config['qkv_bias']}, q/k norms {config['qk_norm']}, tied output "
                            f"layer {config['tie_embeddings']}); the weights do not belong to it")
        if tuple(t.shape) != shapes[key]:
            raise UserError(f"{file_of(name)}: tensor {name!r} has shape {tuple(t.shape)} but "
                            f"config.json gives {shapes[key]}; the weights do not belong to "
                            f"config.json")
        ours, part = WEIGHT_NAMES[key]
        if match:
            ours = ours.replace(".N.", f".{match.group(1)}.")
        if part is None:
            tensors[ours], source[ours] = t, name
        else:
            tensors.setdefault(ours, [None] * (2 if ".mlp." in ours else 3))[part] = t
            source.setdefault(ours, [None] * len(tensors[ours]))[part] = name
    for ours, parts in tensors.items():
        if isinstance(parts, list) and None in parts:
            given = [n for n in source[ours] if n]
            raise UserError(f"{file_of(given[0])}: {given[0]!r} is there but not every tensor "
                            f"stacked with it into our {ours}; the checkpoint is incomplete")
    return tensors, {k: v if isinstance(v, str) else "+".join(v) for k, v in source.items()}


def tokenizer_id_count(folder: str) -> int | None:
    """How many ids the folder's tokenizer has (its largest id + 1): from tokenizer.json (the
    model's vocabulary and the added tokens), else GPT-2's vocab.json; None without either."""
    try:
        if os.path.isfile(path := os.path.join(folder, "tokenizer.json")):
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
            ids = [*(spec.get("model") or {}).get("vocab", {}).values(),
                   *(t["id"] for t in spec.get("added_tokens") or [])]
        elif os.path.isfile(path := os.path.join(folder, "vocab.json")):
            with open(path, encoding="utf-8") as f:
                ids = list(json.load(f).values())
        else:
            return None
        return max(ids) + 1 if ids else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"cannot count the ids of {path} ({e}); fix or remove the file") from None


# ---- backwards: our GPT -> a Hugging Face folder (run/export.py) -----------------------

def family_of(config) -> str:
    """The family whose layout a GPTConfig of rotary positions, RMSNorm and SwiGLU has: q/k/v
    biases are Qwen2's, q/k norms Qwen3's, neither Llama's (SmolLM2's). UserError for a layout
    no family has."""
    if config.bias or config.rms_norm_eps is None or config.mlp_hidden is None:
        raise UserError("the model has rotary positions but not the rest of a family's layout "
                        "(RMSNorm, SwiGLU, no biases); no Hugging Face family computes it")
    for family, parts in FAMILIES.items():
        if (config.qkv_bias, config.qk_norm) == (parts["qkv_bias"], parts["qk_norm"]):
            return family
    raise UserError("the model has both q/k/v biases (Qwen2) and q/k norms (Qwen3); no Hugging "
                    "Face family computes it")


def family_hparams(config, rows: int) -> dict:
    """config.json of the model's family: `family_config` backwards, in the layout published
    files have (`rope_theta` and `rope_scaling`, which transformers 5 reads too). `rows`: the
    embedding's rows (the `vocab_size` written)."""
    family = family_of(config)
    architecture, switched_off = WRITTEN[family]
    scaling = config.rope_scaling and {
        "rope_type": "llama3", **{k: config.rope_scaling[k] for k in LLAMA3_KEYS},
        "original_max_position_embeddings": int(config.rope_scaling["original_max_position_embeddings"])}
    return {"architectures": [architecture], "model_type": family, "vocab_size": rows,
            "hidden_size": config.n_embd, "intermediate_size": config.mlp_hidden,
            "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
            "num_key_value_heads": config.n_kv_head, "head_dim": config.head_dim,
            "max_position_embeddings": config.block_size, "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta, "rope_scaling": scaling or None, "hidden_act": "silu",
            "tie_word_embeddings": config.tie_embeddings, "attention_dropout": config.dropout,
            **switched_off}


def ours_to_family(state: dict, config, rows: int) -> dict:
    """`rename` backwards: our state dict under the checkpoint's names (WEIGHT_NAMES read from
    right to left), c_attn split into q_proj, k_proj, v_proj and c_fc into gate_proj, up_proj,
    the embedding (and an untied output layer) cut to its first `rows`. A tied output layer is
    the embedding, so it is not written."""
    hs = config.head_dim
    widths = {"c_attn": (config.n_head * hs, config.n_kv_head * hs, config.n_kv_head * hs),
              "c_fc": (config.mlp_hidden, config.mlp_hidden)}
    theirs_of = {}  # our name (N: a block's number) -> {part: the checkpoint's name}
    for theirs, (ours, part) in WEIGHT_NAMES.items():
        theirs_of.setdefault(ours, {})[part] = theirs
    tensors = {}
    for name, t in state.items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        match = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)", name)
        ours = f"transformer.h.N.{match.group(2)}" if match else name
        assert ours in theirs_of, f"our {name} has no entry in WEIGHT_NAMES"
        parts = theirs_of[ours]
        pieces = {None: t} if None in parts else dict(enumerate(t.split(widths[ours.split(".")[-2]])))
        for part, theirs in parts.items():
            piece = pieces[part][:rows] if theirs in ("embed_tokens.weight", "lm_head.weight") else pieces[part]
            if match:
                theirs = theirs.replace("layers.N.", f"layers.{match.group(1)}.")
            tensors[theirs if theirs == "lm_head.weight" else f"model.{theirs}"] = piece
    return tensors
