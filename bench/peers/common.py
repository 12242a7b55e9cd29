"""Shared bits of the peer benchmarks: offline settings, shapes, a no-download tokenizer, the
random-init GPT-2 models, the peak-RSS reader.

Imported by trl_ppo.py and hf_generate.py, which run in bench/peers/.venv (see setup.sh).
"""
from __future__ import annotations

import os

# Nothing is fetched at run time: no hub look-ups, no telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# GPT-2 architectures, all dropouts 0.
SHAPES = {
    # bench/ppo_speed.py's fixed PPO config
    "toy": dict(vocab_size=64, n_layer=4, n_head=4, n_embd=128, n_positions=256),
    # GPT-2 small
    "gpt2": dict(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, n_positions=1024),
}


def gpt2_config(shape: dict, attn: str = "sdpa"):
    """A GPT2Config of `shape` with every dropout at 0. Its BOS/EOS id is `vocab_size`: one past
    the last logit, so the model can never sample it and every row runs to max_new_tokens."""
    from transformers import GPT2Config

    v = shape["vocab_size"]
    config = GPT2Config(**shape, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        summary_first_dropout=0.0, bos_token_id=v, eos_token_id=v,
                        pad_token_id=v)
    config._attn_implementation = attn  # "sdpa" (torch's fused attention) or "eager"
    return config


def gpt2_model(shape: dict, attn: str = "sdpa"):
    """A random-init GPT2LMHeadModel (float32, CPU) of `shape`, built from its config."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel(gpt2_config(shape, attn))


def offline_tokenizer(vocab_size: int):
    """A PreTrainedTokenizerFast built in memory: ids 0..vocab_size-1 are the words
    't0'...'t{V-1}', and id V is '<eos>', also the pad token. trl only uses the tokenizer for
    pad() (left padding before generate), the pad/eos ids and its LM data collator; nothing is
    padded here (equal lengths), so id V never reaches the embedding."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab["<eos>"] = vocab_size
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>",
                                   bos_token="<eos>", unk_token="<eos>")


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux VmHWM), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import trl
        out["trl"] = trl.__version__
    except ImportError:
        pass
    try:
        import peft
        out["peft"] = peft.__version__
    except ImportError:
        pass
    return out


def emit(result: dict, path: str = "") -> None:
    """Print `result` as one JSON line, and write the same line to `path` if one is given."""
    import json

    line = json.dumps(result)
    print(line)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(line + "\n")
