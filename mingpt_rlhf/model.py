"""The GPT: GPT-2's architecture and parameter names, padding-aware attention, a KV cache.

GPT-2 (Radford et al. 2019) is a stack of pre-LayerNorm transformer blocks over learned token
and position embeddings, with the output layer tied to the token embedding. We keep GPT-2's
parameter names (`transformer.wte`, `transformer.h.0.attn.c_attn`, ... `lm_head`) so that
loading the published weights is a renaming plus four transposes (see `machinery/pretrained.py`).
Today's families (Llama 3, SmolLM2, Qwen2/2.5, Qwen3) swap a few of its parts: they end this file.

Two things an RLHF model needs beyond nanoGPT:
- **Left padding.** Prompts are padded on the left, so all responses start at the same column;
  `attention_mask` (B, T) marks real tokens with 1. Pads are never attended to, and position
  ids count real tokens only (`cumsum(mask) - 1`): a padded row gets the logits it gets alone.
- **A KV cache.** Sampling one token at a time re-uses the keys and values of earlier
  positions instead of recomputing the whole prefix (`KVCache`, used by `sampling.py`).

`trunk()` returns the final hidden states (B, T, C), which the reward model and the critic
(`heads.py`) put their heads on; `forward()` = `logits(trunk())`, logits for every position.
Code that needs the log-probs of a few positions (RL, SFT at a 50k vocabulary) calls `trunk()`
and applies `logits()`, the output layer, to those positions only (`logprobs.py`).

At GPT-2 scale three more details matter:
- **The output layer in float32**, even under bf16 autocast: GPT-2's logits sit near -90,
  where bf16 can only step by 0.5 nats, which would make every log-prob and KL coarse.
- **The vocabulary padded to a multiple of 64** rows (50,257 -> 50,304, as nanoGPT does) so
  the large output matmul runs on aligned shapes. `logits()` returns `vocab_size` columns, so
  a padded row (or one that no token uses, as in Qwen's embedding) can never be sampled.
- **Gradient checkpointing** (`grad_checkpoint = True`): while training, each block reruns in
  the backward pass, its input alone kept: ~30 % more compute for one block's activations, not all.

Try it:  python -c "import torch; from mingpt_rlhf.model import *; m=GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=16)); print(m(torch.zeros(1, 5, dtype=torch.long)).shape)"
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .machinery.errors import UserError
from .machinery.packing import Packing


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 256   # longest sequence (prompt + response) the model can see
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True       # GPT-2 has biases in Linear and LayerNorm layers
    vocab_multiple: int = 64  # embedding rows are padded to a multiple of this (1 = no padding)
    # Today's families (Llama 3 / SmolLM2, Qwen2 / 2.5, Qwen3) swap some of GPT-2's parts for
    # others; each default below is GPT-2's part (machinery/families.py reads the others from
    # a Hugging Face config.json; docs/families.md walks through them)
    rope_theta: float | None = None   # rotary positions with this base, instead of learned ones
    rope_scaling: dict | None = None  # Llama 3.1+'s longer wavelengths: {"factor": 32.0, ...}
    rms_norm_eps: float | None = None  # RMSNorm with this epsilon, instead of LayerNorm
    mlp_hidden: int | None = None     # a SwiGLU MLP this wide, instead of GELU at 4 * n_embd
    n_kv_head: int | None = None      # key/value heads, each shared by n_head / n_kv_head queries
    head_dim: int | None = None       # width of a head, if not n_embd / n_head (Qwen3: 128 x 16 > 1024)
    qkv_bias: bool = False            # biases on the queries, keys and values only (Qwen2)
    qk_norm: bool = False             # an RMSNorm over each head's queries and keys (Qwen3)
    tie_embeddings: bool = True       # the output layer is the token embedding (GPT-2's tying)
    embedding_rows: int = 0           # rows of a published embedding that has more than tokens

    def __post_init__(self):
        # by default GPT-2's heads: each its own keys and values, n_embd / n_head wide
        self.n_kv_head = self.n_kv_head or self.n_head
        self.head_dim = self.head_dim or self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        rows = max(self.vocab_size, self.embedding_rows)
        return -(-rows // self.vocab_multiple) * self.vocab_multiple


class KVCache:
    """Pre-allocated keys and values of every layer, filled as generation proceeds.

    Writing into a fixed buffer (instead of `torch.cat` each step) keeps decoding at one small
    copy per layer per token: a layer's keys and values sit side by side in `kv`, so a single
    copy stores both. `length` is how many positions are filled.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, dtype):
        shape = (config.n_layer, 2, batch_size, config.n_kv_head, max_len, config.head_dim)
        self.kv = torch.empty(shape, device=device, dtype=dtype)  # (L, 2, B, nkv, S, hs)
        self.length = 0

    def update(self, layer: int, kv: torch.Tensor) -> torch.Tensor:
        """Store this step's keys and values (2, B, nh, T, hs); return all so far (2, B, nh, S, hs)."""
        end = self.length + kv.size(3)
        layer_kv = self.kv[layer]
        layer_kv[:, :, :, self.length:end] = kv
        return layer_kv[:, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be divisible by n_head"
        self.layer = layer
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, attn_mask=None, kv_cache: KVCache | None = None, rope=None):
        B, T, C = x.shape  # batch, time, channels
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        # one permute gives q, k and v as views; fewer small ops matter when decoding one token
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, kv = qkv[0], qkv[1:]           # (B, nh, T, hs), (2, B, nh, T, hs)
        if kv_cache is not None:
            kv = kv_cache.update(self.layer, kv)  # (2, B, nh, S, hs), S = cached + T
        k, v = kv.unbind(0)
        dropout_p = self.dropout if self.training else 0.0
        # with no mask, either queries and keys are the same positions (plain causal: SDPA's
        # fastest path) or one new token sees every cached key. SDPA's is_causal aligns the
        # mask top-left, which would be wrong for a single query after a cache.
        is_causal = attn_mask is None and T > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                           dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C); a view when T == 1
        y = self.c_proj(y)
        # dropout is the identity in eval mode; skipping the call is measurable when decoding
        return self.resid_dropout(y) if self.training else y


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # GPT-2 uses the tanh approximation of GELU; the exact one changes logits by ~1e-3
        x = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        return self.dropout(x) if self.training else x  # identity in eval: skip the call


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        # GPT-2's parts, or those of today's families where the config names them (below)
        self.ln_1 = norm(config, config.n_embd)
        self.attn = (CausalSelfAttention if config.rope_theta is None else RotaryAttention)(config, layer)
        self.ln_2 = norm(config, config.n_embd)
        self.mlp = MLP(config) if config.mlp_hidden is None else SwiGLU(config)

    def forward(self, x, attn_mask=None, kv_cache=None, rope=None):  # rope: None for GPT-2
        x = x + self.attn(self.ln_1(x), attn_mask, kv_cache, rope)
        return x + self.mlp(self.ln_2(x))


def build_attn_mask(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """Boolean (B, 1, T, S) mask for the last T of S positions: True where attention is allowed.

    A query at absolute position i may see key j when j <= i (causal) and key j is a real token.
    Every query also sees itself, so the query rows of pad positions are never fully masked
    (a fully masked row makes softmax produce NaN); what pads compute is ignored anyway.
    """
    B, S = attention_mask.shape
    device = attention_mask.device
    q_pos = torch.arange(S - T, S, device=device)[:, None]  # (T, 1) absolute query positions
    k_pos = torch.arange(S, device=device)[None, :]         # (1, S)
    causal = k_pos <= q_pos                                  # (T, S)
    mask = causal[None] & attention_mask[:, None, :].bool()  # (B, T, S)
    mask = mask | (k_pos == q_pos)[None]
    return mask[:, None]                                     # (B, 1, T, S)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: a left-padded row starts at position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        embeddings = dict(wte=nn.Embedding(config.padded_vocab_size, config.n_embd))
        if config.rope_theta is None:  # learned positions (rotary ones have no weights)
            embeddings["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(dict(
            **embeddings,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=norm(config, config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.keep_float32 = True  # logits() computes in float32: never held in bf16
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight  # weight tying, as in GPT-2
        self.grad_checkpoint = False  # recompute each block in backward (set by the scripts)
        self.compiled_blocks = None   # torch.compile'd `blocks` for passes without a KV cache
        self.apply(self._init_weights)
        # GPT-2: scale the projections into the residual stream by 1/sqrt(2 * n_layer),
        # since each block adds two of them to the same stream
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_pretrained(cls, name_or_path: str, vocab_size: int | None = None) -> "GPT":
        """Published weights, in eval mode: GPT-2 (a folder, a .safetensors file, or a name:
        gpt2, gpt2-medium, ...), or a Hugging Face folder of Llama 3 / SmolLM2, Qwen2 / 2.5 or
        Qwen3 (config.json and model.safetensors, or shards). `vocab_size`: the tokenizer's
        ids, the columns of the logits. More than the checkpoint's rows adds rows (our BPE's
        PAD), set to the mean embedding; fewer leaves rows no token uses (Qwen's), which are
        never returned. Reading and renaming are machinery/pretrained.py's and families.py's;
        they know nothing of this class."""
        from .machinery.pretrained import copy_weights, pretrained_weights
        config, tensors, source, path = pretrained_weights(name_or_path, vocab_size)
        # no random initialisation (2-3 s for gpt2 on a laptop CPU, ~10x that for gpt2-xl):
        # every parameter is overwritten
        model = build_empty(lambda: cls(GPTConfig(**config)))
        assert not list(model.buffers()), "GPT has buffers: to_empty() leaves them uninitialised"
        copy_weights(dict(model.named_parameters()), tensors, source, path)
        return model.eval()

    def set_dropout(self, p: float) -> None:
        """Change the dropout probability everywhere (PPO needs 0: with dropout the first ratio is not 1, ppo_trainer.py)."""
        self.config.dropout = p
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
            elif isinstance(m, (CausalSelfAttention, RotaryAttention)):
                m.dropout = p

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def trunk(self, idx, attention_mask=None, position_ids=None, kv_cache: KVCache | None = None):
        """Final hidden states (B, T, C) after `ln_f`.

        idx: (B, T) token ids. attention_mask: (B, S) with 1 for real tokens, where S = T, or
        S = cached length + T when decoding with `kv_cache`. position_ids: (B, T); by default
        they are computed from the mask so that padding does not shift positions.
        """
        B, T = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        # positions, not columns, must fit: a caller that numbers its own positions (episodes,
        # with padding between turns) may hold more columns than block_size in its cache
        if position_ids is None and past + T > self.config.block_size:
            raise ValueError(f"sequence of {past + T} tokens is longer than block_size "
                             f"{self.config.block_size}")
        # no padding anywhere: take the unmasked fast path. Not asked in a decoding step of one
        # token: the answer is a host sync (the CPU waits for the GPU), and sampling passes a
        # mask there only when it holds padding (sampling.py keeps one sync per token, for
        # its early stop when every row has ended)
        if attention_mask is not None and not (kv_cache is not None and T == 1) \
                and attention_mask.all():
            attention_mask = None
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(past, past + T, device=idx.device)[None]  # (1, T)
            else:
                position_ids = position_ids_from_mask(attention_mask)[:, -T:]         # (B, T)
        position_ids = position_ids.expand(B, T)  # a (1, T) row serves every sequence
        if attention_mask is None:
            # a decoding step of one token needs no mask: it may see every cached position
            attn_mask = None if past == 0 or T == 1 else build_attn_mask(
                torch.ones(B, past + T, dtype=torch.bool, device=idx.device), T)
        elif kv_cache is None and (packing := Packing.of(attention_mask)) is not None:
            # mostly padding: run the blocks on the real tokens only (machinery/packing.py)
            hidden = (self.compiled_blocks or self.blocks)(
                packing.pack(idx), packing.pack(position_ids), packing.attn_mask)
            return packing.unpack(hidden)                             # (B, T, C), 0 at pads
        elif kv_cache is None and (attention_mask[:, 1:] <= attention_mask[:, :-1]).all():
            attn_mask = None  # right padding only: causal attention never looks at it
        else:
            attn_mask = build_attn_mask(attention_mask, T)
        if kv_cache is None and self.compiled_blocks is not None:
            return self.compiled_blocks(idx, position_ids, attn_mask)
        return self.blocks(idx, position_ids, attn_mask, kv_cache)

    def compile_blocks(self) -> None:
        """--compile: torch.compile the blocks for every pass without a KV cache (training,
        scoring; sampling, whose shapes change every step, stays eager). Shapes are marked
        dynamic, so a new batch width does not compile again."""
        self.compiled_blocks = torch.compile(self.blocks, dynamic=True)

    def blocks(self, idx, position_ids, attn_mask=None, kv_cache: KVCache | None = None):
        """Embeddings, the blocks and `ln_f`: (B, T) ids and positions -> (B, T, C). `attn_mask`
        (B, 1, T, S) says which keys each query sees (None: causal, or every cached key)."""
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None if self.config.rope_theta is None else rotary_tables(position_ids, self.config)
        if rope is None:  # GPT-2's learned positions; rotary ones turn q and k in each attention
            x = x + self.transformer.wpe(position_ids)
        if self.training:  # dropout is the identity in eval mode: skip the call
            x = self.transformer.drop(x)
        recompute = self.grad_checkpoint and kv_cache is None and torch.is_grad_enabled()
        for block in self.transformer.h:
            if recompute:  # keep only the block's input; rerun the block in backward
                x = checkpoint(block, x, attn_mask, None, rope, use_reentrant=False)
            else:
                x = block(x, attn_mask, kv_cache, rope)
        if kv_cache is not None:
            kv_cache.length += x.size(1)
        return self.transformer.ln_f(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output layer: (..., C) hidden states -> (..., vocab_size) float32 logits.

        Autocast is switched off here: bf16 logits of GPT-2 are coarse (steps of 0.5 nats
        near -90). The padded vocabulary rows are cut off, so they are never sampled."""
        weight = self.lm_head.weight
        with torch.autocast(hidden.device.type, enabled=False):
            hidden = hidden.to(weight.dtype)
            if hidden.dim() == 2 and len(hidden) <= 32 and hidden.device.type == "cpu":
                # a decoding step: a few rows against the whole (V, C) matrix. The CPU's GEMM
                # reads the weight faster as W h^T than as h W^T for so few rows (measured
                # at GPT-2's vocabulary, 8 rows: 15-21 ms against 23-32 ms), same products
                logits = (weight @ hidden.t()).t()
            else:
                logits = F.linear(hidden, weight)
        return logits[..., :self.config.vocab_size]

    def forward(self, idx, attention_mask=None, position_ids=None, kv_cache=None,
                return_hidden: bool = False):
        """Logits (B, T, vocab_size) for every position; with `return_hidden`, also (B, T, C)."""
        hidden = self.trunk(idx, attention_mask, position_ids, kv_cache)
        logits = self.logits(hidden)
        return (logits, hidden) if return_hidden else logits

    def new_kv_cache(self, batch_size: int, max_len: int) -> KVCache:
        """A cache in the dtype the keys and values are computed in: the autocast dtype when
        autocast is on (bf16 keys stored as fp32 would double the cache for nothing), else
        that of the attention weights."""
        w = self.transformer.h[0].attn.c_attn.weight
        device = w.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else w.dtype
        return KVCache(self.config, batch_size, max_len, w.device, dtype)

    def optim_groups(self, weight_decay: float):
        """AdamW groups: decay matrices (embeddings, Linear weights) only, never biases or norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]


# ---- Today's families: the parts that replace GPT-2's -------------------------------------
# Llama 3 (and SmolLM2, which is Llama's layout), Qwen2 / 2.5 and Qwen3 are GPT-2's block with
# some parts swapped, each chosen by a field of GPTConfig: rotary positions for learned ones,
# RMSNorm for LayerNorm, SwiGLU for the GELU MLP, fewer key/value heads than query heads, and
# per family q/k/v biases (Qwen2) or a norm on q and k (Qwen3). The parameter names stay
# GPT-2's (c_attn holds q, k and v; c_fc holds SwiGLU's gate and up), so LoRA, checkpoints and
# every script treat them alike. docs/families.md walks from one block to the other.


def norm(config: GPTConfig, width: int) -> nn.Module:
    """GPT-2's LayerNorm, or an RMSNorm where the config gives its epsilon."""
    if config.rms_norm_eps is None:
        return nn.LayerNorm(width, bias=config.bias)
    return RMSNorm(width, config.rms_norm_eps)


class RMSNorm(nn.Module):
    """Replaces LayerNorm: x / RMS(x) * weight, with neither LayerNorm's mean subtraction nor
    its bias (Zhang & Sennrich 2019). Computed in float32 whatever the input's dtype, and cast
    back before the weight multiplies, as the reference implementation does."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class SwiGLU(nn.Module):
    """Replaces the GELU MLP: down(silu(gate(x)) * up(x)) (Shazeer 2020), a gated unit
    `mlp_hidden` wide (Qwen3-0.6B: 3,072 for a width of 1,024, where GPT-2 has 4x). gate and
    up are one matrix, c_fc (the checkpoint's gate_proj rows, then up_proj's): one matmul."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)  # (B, T, H) each
        x = self.c_proj(F.silu(gate) * up)
        return self.dropout(x) if self.training else x


class RotaryAttention(nn.Module):
    """Replaces CausalSelfAttention. The same causal attention over the same masks and KV
    cache, with
    - rotary positions (Su et al. 2021): each head's queries and keys are turned by angles
      that grow with the position (`apply_rotary`), so q . k depends on how far apart the two
      tokens are; no position embedding is added to the tokens;
    - grouped key/value heads (Ainslie et al. 2023): n_kv_head heads of keys and values, each
      shared by n_head / n_kv_head query heads; the KV cache holds n_kv_head heads;
    - a head width of its own (`head_dim`), biases on q, k, v only (Qwen2), and an RMSNorm
      over each head's queries and keys before they turn (Qwen3).
    q, k and v are one matrix, c_attn (the checkpoint's q_proj, k_proj, v_proj rows stacked)."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, hs = config.n_head, config.n_kv_head, config.head_dim
        assert config.n_head % config.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        self.widths = (config.n_head * hs, config.n_kv_head * hs, config.n_kv_head * hs)  # q, k, v
        self.c_attn = nn.Linear(config.n_embd, sum(self.widths), bias=config.bias or config.qkv_bias)
        self.c_proj = nn.Linear(config.n_head * hs, config.n_embd, bias=config.bias)
        head_norm = lambda: RMSNorm(hs, config.rms_norm_eps) if config.qk_norm else nn.Identity()
        self.q_norm, self.k_norm = head_norm(), head_norm()
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, attn_mask=None, kv_cache: KVCache | None = None, rope=None):
        B, T, C = x.shape  # batch, time, channels
        q, k, v = self.c_attn(x).split(self.widths, dim=-1)
        q = self.q_norm(q.view(B, T, self.n_head, -1)).transpose(1, 2)     # (B, nh, T, hs)
        k = self.k_norm(k.view(B, T, self.n_kv_head, -1)).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, -1).transpose(1, 2)               # (B, nkv, T, hs)
        kv = torch.stack((apply_rotary(k, rope), v))                        # (2, B, nkv, T, hs)
        if kv_cache is not None:
            kv = kv_cache.update(self.layer, kv)  # (2, B, nkv, S, hs), S = cached + T
        k, v = kv.unbind(0)
        # each group of n_head / n_kv_head query heads attends with one key/value head
        y = F.scaled_dot_product_attention(
            apply_rotary(q, rope), k, v, attn_mask=attn_mask, is_causal=attn_mask is None and T > 1,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.n_kv_head < self.n_head)
        y = self.c_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, nh * hs) -> (B, T, C)
        return self.resid_dropout(y) if self.training else y


def rotary_frequencies(config: GPTConfig) -> torch.Tensor:
    """(hs / 2,) float32: how fast each pair of a head's dimensions turns per position,
    theta^(-2i / hs). Llama 3.1+'s "llama3" scaling (for contexts longer than it was first
    trained on) slows the slow pairs down by `factor`: those whose wavelength 2 pi / frequency
    exceeds the original context / low_freq_factor; it keeps the fast ones (wavelength under
    context / high_freq_factor) and blends the two linearly in between."""
    hs = config.head_dim
    frequency = 1.0 / (config.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float) / hs))
    scaling = config.rope_scaling
    if not scaling:
        return frequency
    wavelength = 2 * math.pi / frequency
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    kept = (scaling["original_max_position_embeddings"] / wavelength - low) / (high - low)
    kept = kept.clamp(0.0, 1.0)  # 0: slowed down by factor, 1: kept as it is
    return kept * frequency + (1 - kept) * frequency / scaling["factor"]


def rotary_tables(position_ids: torch.Tensor, config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (B, 1, T, hs) each, in float32: the angle of
    pair i at position p is p * frequency_i. Positions count real tokens only, as GPT-2's."""
    frequency = rotary_frequencies(config).to(position_ids.device)
    angles = position_ids[..., None].float() * frequency       # (B, T, hs / 2)
    angles = torch.cat((angles, angles), dim=-1)[:, None]       # (B, 1, T, hs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, rope) -> torch.Tensor:
    """Turn x (B, h, T, hs) by the tables: dimension i and i + hs/2 are a pair (the layout of
    the published weights), turned as a point in the plane, (a, b) -> (a cos - b sin,
    b cos + a sin). In float32, returned in x's dtype."""
    cos, sin = rope
    first, second = x.chunk(2, dim=-1)
    turned = torch.cat((-second, first), dim=-1)  # (a, b) -> (-b, a), a quarter turn
    return (x * cos + turned * sin).to(x.dtype)


def build_empty(make, device="cpu") -> nn.Module:
    """`make()` built on the "meta" device (shapes, no memory, no random initialisation), then
    given uninitialised memory on `device`: for a module whose every tensor is loaded next.
    At GPT-2 size this skips 1-3 s of random numbers and a second copy of the weights in
    memory. to_empty() unties shared parameters, so each GPT's output layer is tied again."""
    with torch.device("meta"):
        module = make()
    module.to_empty(device=device)
    for m in module.modules():
        if isinstance(m, GPT) and m.config.tie_embeddings:
            m.lm_head.weight = m.transformer.wte.weight
    return module


def pad_vocab_rows(state_dict: dict, config: GPTConfig) -> dict:
    """A state dict written before the vocabulary was padded has `vocab_size` embedding rows;
    give it the padded rows (zeros: never an input, never returned as a logit)."""
    out = dict(state_dict)
    for name, t in state_dict.items():
        if name.endswith("transformer.wte.weight") and t.shape[0] == config.vocab_size \
                and config.padded_vocab_size > config.vocab_size:
            out[name] = torch.cat([t, t.new_zeros(config.padded_vocab_size - t.shape[0], t.shape[1])])
    return out


def load_state_dict_checked(module: torch.nn.Module, state_dict: dict, where: str,
                            assign: bool = False) -> None:
    """`module.load_state_dict`, but a mismatch names the first tensor that does not fit.
    A GPT state dict from before the vocabulary was padded gets its padded rows.
    `assign=True` makes the loaded tensors the module's own, with no copy: for a frozen
    model loaded from a memory-mapped checkpoint, its weights stay pages of the file."""
    if getattr(module, "config", None) is not None:
        state_dict = pad_vocab_rows(state_dict, module.config)
    own = module.state_dict()
    for name, tensor in own.items():
        if name not in state_dict:
            raise UserError(f"{where} has no tensor {name!r}: it was written for another model")
        if state_dict[name].shape != tensor.shape:
            raise UserError(f"{where}: tensor {name!r} has shape {tuple(state_dict[name].shape)} "
                            f"but the model expects {tuple(tensor.shape)}; the model options "
                            f"(--n_layer/--n_head/--n_embd/--block_size) differ from the "
                            f"checkpoint's")
    extra = sorted(set(state_dict) - set(own))
    if extra:
        raise UserError(f"{where} has tensors the model lacks, e.g. {extra[0]!r}: "
                        f"it was written for another model")
    if assign:  # the module's dtypes stay (a copying load would cast to them too)
        state_dict = {k: v if v.dtype == own[k].dtype else v.to(own[k].dtype)
                      for k, v in state_dict.items()}
    module.load_state_dict(state_dict, assign=assign)
    if assign:  # each key got its own tensor object: tie GPT's output layer again
        for m in module.modules():
            if isinstance(m, GPT) and m.config.tie_embeddings:
                m.lm_head.weight = m.transformer.wte.weight
