"""Ours against the libraries our users would otherwise pick, measured side by side in one run:
trl 1.16's GRPOTrainer (transformers 5; venv bench/peers/trl1/), and trl 0.11.4's classic
PPOTrainer and transformers 4.45.2's generate (venv bench/peers/).

    bash bench/peers/setup.sh                    # once: bench/peers/.venv (trl 0.11.4, transformers 4.45)
    bash bench/peers/trl1/setup.sh               # once: bench/peers/trl1/.venv (trl 1.16, transformers 5)
    python bench/vs_peers.py                     # every part, 3 rounds
    python bench/vs_peers.py --part toy gpt2 --rounds 5
    python bench/vs_peers.py --part grpo_toy grpo_gpt2 grpo_toy_bf16 grpo_gpt2_bf16
    python bench/vs_peers.py --part grpo_qwen3 --rounds 1     # Qwen3-0.6B's shape (not in the default set)

Parts (each the same shapes, batch, lengths, sampling and thread count on both sides):
- toy:        one PPO iteration of bench/ppo_speed.py's config (vocab 64, 4 x 4 x 128; 64
              prompts of 16 tokens, 32 new tokens, 4 epochs x 4 minibatches of 16, shared
              critic, plain reward function);
- gpt2:       one PPO iteration at GPT-2-small shape (12 x 12 x 768, 50,257 ids): 8 prompts of
              64 tokens, 32 new tokens, 1 epoch of 2 minibatches, shared critic, no ptx. Ours
              runs train_ppo.main from an SFT and a reward-model checkpoint (both with their
              AdamW state, as train_sft.py and train_rm.py write them) and scores with the
              GPT-2-size reward model; trl scores with a plain function;
- gpt2_lora:  the same with LoRA rank 16 on c_attn, c_proj, c_fc (trl: peft, the reference
              is the model with its adapters off, as ours);
- gen_tiny, gen_gpt2: sampling only (plain sampling, temperature 1, no EOS): 16 rows of 32 +
              64 tokens on the tiny model; 8 rows of 64 + 32 tokens at GPT-2 shape;
- grpo_toy, grpo_gpt2 (float32), grpo_toy_bf16, grpo_gpt2_bf16 (bfloat16 autocast on both
              sides): one GRPO step against trl 1.x's GRPOTrainer (bench/peers/trl_grpo.py),
              toy = 4 layers x 128 with GPT-2's vocabulary, gpt2 = GPT-2 small: 8 prompts x a
              group of 4, 64 prompt + exactly 32 new tokens, a trivial reward function, beta
              0.04 with k3 in the loss, group mean and std, one AdamW step per batch, gradient
              clipping 1.0, dropout off, no gradient checkpointing. Both sides load the same
              random weights from one checkpoint (`grpo_fixture`); ours runs `train_ppo.main`
              with GRPO_FLAGS + GRPO_EQUAL (the command line docs/speed.md gives);
- grpo_toy_defaults, grpo_gpt2_defaults: the same workload, each side with its own defaults
              for everything else (trl: bf16, gradient checkpointing, loss "dapo", beta 0, ...;
              ours: float32 on a CPU, Dr. GRPO with the KL in the reward, ...).
- grpo_qwen3 (float32; also _bf16, _defaults): the same GRPO step at Qwen3-0.6B's shape (28
              layers x 1,024, 16 query and 8 key/value heads of 128, SwiGLU 3,072, vocabulary
              151,936, tied), random weights in a Hugging Face folder both sides load
              (`write_qwen3_fixture`), at QWEN3_PROMPTS prompts x 4 (fewer than 8 so that both
              sides fit in memory: an out-of-memory kill is recorded as a result, not an
              error), and its summary gives where the time goes at this vocabulary
              (`output_layer_floors`: the output layer's matmuls and log-softmax alone, at
              this machine's measured rates). Not in the default set of parts: ~10 minutes a
              round on 2 cores.
Seconds are medians over each process's measured iterations (after a warm-up iteration);
peak memory is the whole process's peak resident set (VmHWM), loading included, under glibc's
default allocator. Each round runs ours, then the peer, each in a fresh process, so a slow
minute of the machine hits both; the ratios are per round, and the JSON keeps every round.
Gradient clipping at 1.0 on both sides (trl's default is none).

For the GPT-2 parts, each of our phases is written beside its floor on this machine: the
matrix multiplies' FLOPs at the GEMM rate measured here at the same shapes (prefill, score,
learn), and the bytes of weights read per decoding step at the measured memory bandwidth
(decode): no implementation can be faster than those here.

Writes bench/results/vs_peers.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_PY = os.path.join(ROOT, "bench", "peers", ".venv", "bin", "python")
PEER1_PY = os.path.join(ROOT, "bench", "peers", "trl1", ".venv", "bin", "python")  # trl 1.x
RESULTS = os.path.join(ROOT, "bench", "results", "vs_peers.json")
FIXTURES = os.path.join(ROOT, "out", "vs_peers")
GPT2 = dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, rows=8, prompt=64, new=32)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


# ----------------------------------------------------------------------------- our side
def ours_toy(threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from ppo_speed import measure
    result = measure("shared", "float32", iters=5, warmup=1, floor=True)
    return {**result, "peak_rss_mb": peak_rss_mb()}


def gpt2_fixtures() -> dict:
    """GPT-2-shaped weights and BPE (bench/gpt2_scale.py), then an SFT and a reward-model
    checkpoint trained for a step from them, with their optimizer state (once)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from gpt2_scale import prepare
    folder = os.path.join(ROOT, "out", "gpt2_scale", "small")
    prepare(folder, "small", "cpu")
    data = os.path.join(folder, "cpu")
    sft, rm = os.path.join(FIXTURES, "sft"), os.path.join(FIXTURES, "rm")
    if not os.path.exists(os.path.join(rm, "ckpt.pt")):
        os.environ["MINGPT_RLHF_PLOT"] = "0"
        import train_rm
        import train_sft
        train_sft.main(train_sft.Config(init_from=folder, data=os.path.join(data, "demos.jsonl"),
                                        out_dir=sft, batch_size=2, max_iters=1, warmup_iters=0,
                                        eval_interval=1000, eval_prompts=0))
        cut = os.path.join(FIXTURES, "prefs.jsonl")
        with open(os.path.join(data, "prefs.jsonl")) as src, open(cut, "w") as dst:
            dst.writelines(line for i, line in enumerate(src) if i < 8)
        train_rm.main(train_rm.Config(sft_dir=sft, data=cut, out_dir=rm, batch_size=2, epochs=1,
                                      warmup_iters=0, eval_interval=1000, norm_samples=0))
    return {"sft": sft, "rm": rm, "prompts": os.path.join(data, "prompts.jsonl")}


def timed_train_ppo(cfg, warmup: int) -> dict:
    """train_ppo.main(cfg) with each PPOTrainer.step timed: medians of its seconds and phases
    after `warmup` steps, every measured step's seconds, and the process's peak resident set
    both right after the last step and at the end (the final eval and checkpoint included)."""
    import torch
    import train_ppo
    from mingpt_rlhf.ppo_trainer import PPOTrainer
    steps, real_step = [], PPOTrainer.step

    def timed_step(self, *args, **kwargs):
        start = time.perf_counter()
        out = real_step(self, *args, **kwargs)
        steps.append({"sec_per_iter": time.perf_counter() - start,
                      **{k: out[1][k] for k in ("t_generate", "t_score", "t_learn", "resp_len")},
                      "peak": peak_rss_mb()})
        return out
    PPOTrainer.step = timed_step
    try:
        train_ppo.main(cfg)
    finally:
        PPOTrainer.step = real_step
    measured = steps[warmup:]
    result = {k: round(statistics.median(s[k] for s in measured), 4) for k in measured[0] if k != "peak"}
    result.update(sec_per_iter_all=[round(s["sec_per_iter"], 3) for s in measured],
                  resp_len_all=[s["resp_len"] for s in steps],
                  peak_rss_mb_steps=round(steps[-1]["peak"], 1), peak_rss_mb=round(peak_rss_mb(), 1),
                  threads=torch.get_num_threads())
    return result


def ours_gpt2(threads: int, lora_rank: int) -> dict:
    """train_ppo.main at GPT-2 shape: seconds of each PPOTrainer.step, the process's peak."""
    import torch
    torch.set_num_threads(threads)
    os.environ["MINGPT_RLHF_PLOT"] = "0"
    sys.path.insert(0, ROOT)
    fx = gpt2_fixtures()
    import train_ppo
    warmup, iters = 1, 3
    with tempfile.TemporaryDirectory(prefix="vs_peers_") as out_dir:  # its checkpoint: GBs at GPT-2 size
        result = timed_train_ppo(train_ppo.Config(
            sft_dir=fx["sft"], rm_dir=fx["rm"], prompts=fx["prompts"], out_dir=out_dir,
            max_iters=warmup + iters, rollout_batch_size=GPT2["rows"], minibatch_size=GPT2["rows"] // 2,
            ppo_epochs=1, max_new_tokens=GPT2["new"], critic="shared", ptx_coef=0.0, target_kl=0.0,
            kl_coef=0.05, adaptive_kl=False, actor_lr=5e-5, eval_prompts=2, eval_interval=1000,
            lora_rank=lora_rank, device="cpu", dtype="float32"), warmup)
    result.update(lora_rank=lora_rank)
    return result


# ----------------------------------------------------------------------------- GRPO against trl 1.x
GRPO_SHAPES = {"toy": dict(n_layer=4, n_head=4, n_embd=128),       # GPT-2's vocabulary
               "gpt2": dict(n_layer=12, n_head=12, n_embd=768)}
GRPO = dict(prompts=8, group=4, prompt=64, new=32)
# the work of one step, the same as bench/peers/trl_grpo.py's: 8 prompts x 4, 32 new tokens,
# one pass of one minibatch (one AdamW step), plain sampling
def grpo_flags(prompts: int) -> list[str]:
    return ["--algo", "grpo", "--group_size", str(GRPO["group"]),
            "--rollout_batch_size", str(prompts * GRPO["group"]),
            "--minibatch_size", str(prompts * GRPO["group"]), "--ppo_epochs", "1",
            "--max_new_tokens", str(GRPO["new"]), "--temperature", "1", "--top_k", "0", "--top_p", "1"]


GRPO_FLAGS = grpo_flags(GRPO["prompts"])
# trl's settings in bench/peers/trl_grpo.py, in our options: the GRPO paper's normalisation
# (group mean and std, each response's token mean) with beta x k3 in the loss at a fixed 0.04,
# no early stop on approx-KL, no ptx, a cut-off response keeps its score (trl has no penalty)
GRPO_EQUAL = ["--grpo_norm", "grpo", "--kl_in", "loss", "--kl_coef", "0.04", "--adaptive_kl", "false",
              "--clip_range", "0.2", "--target_kl", "0", "--ptx_coef", "0", "--entropy_coef", "0",
              "--penalize_missing_eos", "false", "--grad_clip", "1.0", "--actor_lr", "5e-5"]


# Qwen3-0.6B's shape (a published config.json's values), and the rows of its embedding that a
# token uses: Qwen3's tokenizer has 151,669 ids for 151,936 rows
QWEN3 = dict(vocab=151936, tokens=151669, n_layer=28, n_head=16, n_kv_head=8, head_dim=128,
             n_embd=1024, mlp=3072, rope_theta=1000000.0, positions=40960)
QWEN3_PROMPTS = 4  # prompts per step at that shape (x a group of 4); GRPO["prompts"] elsewhere
GRPO_PROMPTS = {"qwen3": QWEN3_PROMPTS, "qwen3_tiny": GRPO["prompts"]}
# measured steps of the Qwen3 parts, after one warm-up step. One: the fixture keeps EOS out of
# reach of the random weights (write_qwen3_checkpoint), but training moves the coordinate it
# rests on, and at our third step a response ended early (a run of 2026-11-29), which is less
# work than trl's side does; so both sides time the step after the warm-up.
QWEN3_STEPS = 1
# a test's size of the same family and layout (tests/test_vs_peers.py)
QWEN3_TINY = dict(vocab=640, tokens=600, n_layer=2, n_head=4, n_kv_head=2, head_dim=16,
                  n_embd=32, mlp=48, rope_theta=1000000.0, positions=256)


# ours's own memory saver, not a change of the work: each minibatch of 32 learnt in slices of 8
# rows, their gradients summed before the one AdamW step (the same step; a quarter of the
# activations alive at a time)
OURS_LEAN = ["--learn_batch_size", "8"]


def trivial_reward(prompts, responses, **fields) -> list[float]:
    """The grpo parts' reward (train_ppo's --reward FILE.py:FUNCTION): the fraction of a
    response's characters that are vowels. As cheap as trl's side's, and the scores of a group
    differ, so the advantages are not all 0."""
    return [sum(c in "aeiou" for c in r) / max(len(r), 1) for r in responses]


def unsampleable_eos(weights: str, eos_id: int, logit: float = 60.0) -> None:
    """Make `eos_id` practically unsampleable in a GPT-2 safetensors file, so that every response
    runs to --max_new_tokens on our side too (trl's side puts its EOS one past the vocabulary).
    Its (tied) embedding row is set to -logit x b / |b|^2, b the final layer norm's bias: with
    h = ln_f(x) = w * x_hat + b, its logit h . row = -logit (1 + b . (w * x_hat) / |b|^2), and
    the second term is ~1/sqrt(n_embd) for these random weights: about -logit, while every
    other logit is near 0. Only this row changes; no prompt holds EOS, so it is never an input."""
    import struct
    import torch
    with open(weights, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))

        def at(name):
            return 8 + n + header[name]["data_offsets"][0]
        C = header["ln_f.bias"]["shape"][0]
        assert header["wte.weight"]["dtype"] == "F32" and eos_id < header["wte.weight"]["shape"][0]
        f.seek(at("ln_f.bias"))
        bias = torch.frombuffer(bytearray(f.read(4 * C)), dtype=torch.float32)
        row = -logit * bias / bias.norm() ** 2
        f.seek(at("wte.weight") + 4 * C * eos_id)
        f.write(row.numpy().tobytes())


def write_grpo_fixture(folder: str, n_layer: int, n_head: int, n_embd: int,
                       n_merges: int = 50000, n_prompts: int = 200) -> str:
    """The checkpoint both sides of a grpo part load, once: random weights in GPT-2's
    safetensors layout (bench_pretrained.write_gpt2_checkpoint) with an unsampleable EOS, a
    config.json that transformers and ours both read (dropouts 0; transformers' EOS one past the
    vocabulary), a byte-level BPE of 256 + n_merges + 1 ids (GPT-2's size by default) for ours,
    and prompts.jsonl of `n_prompts` texts of exactly 64 tokens. Returns `folder`."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_pretrained import write_gpt2_checkpoint
    from gpt2_scale import texts_of_length, write_bpe_files
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    prompts_file = os.path.join(folder, "prompts.jsonl")
    if os.path.exists(prompts_file):  # written last: its presence means the rest is there
        return folder
    os.makedirs(folder, exist_ok=True)
    vocab = 256 + n_merges + 1
    write_bpe_files(folder, n_merges)
    weights = os.path.join(folder, "model.safetensors")
    write_gpt2_checkpoint(weights, n_layer, n_embd, vocab=vocab)
    unsampleable_eos(weights, eos_id=vocab - 1)  # <|endoftext|>, the last id
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": vocab,
                   "n_positions": 1024, "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head,
                   "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                   "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                   "summary_first_dropout": 0.0, "tie_word_embeddings": True,
                   "bos_token_id": vocab, "eos_token_id": vocab, "pad_token_id": vocab}, f)
    tok = BPETokenizer.from_pretrained(folder)
    prompts, seed = [], 0
    while len(prompts) < n_prompts:  # texts_of_length is +-1 token: keep the exact ones
        prompts += [p for p in texts_of_length(tok, GRPO["prompt"], n_prompts, seed)
                    if len(tok.encode(p)) == GRPO["prompt"]]
        seed += 1
    with open(prompts_file + ".part", "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts[:n_prompts])
    os.replace(prompts_file + ".part", prompts_file)
    return folder


def qwen3_tensors(shape: dict) -> dict:
    """The Hugging Face names and shapes of a Qwen3 model of `shape` (tied output layer)."""
    C, hs, H = shape["n_embd"], shape["head_dim"], shape["mlp"]
    q, kv = shape["n_head"] * hs, shape["n_kv_head"] * hs
    shapes = {"model.embed_tokens.weight": (shape["vocab"], C)}
    for i in range(shape["n_layer"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (q, C),
                       p + "self_attn.k_proj.weight": (kv, C), p + "self_attn.v_proj.weight": (kv, C),
                       p + "self_attn.q_norm.weight": (hs,), p + "self_attn.k_norm.weight": (hs,),
                       p + "self_attn.o_proj.weight": (C, q), p + "post_attention_layernorm.weight": (C,),
                       p + "mlp.gate_proj.weight": (H, C), p + "mlp.up_proj.weight": (H, C),
                       p + "mlp.down_proj.weight": (C, H)})
    shapes["model.norm.weight"] = (C,)
    return shapes


def write_qwen3_checkpoint(path: str, shape: dict, eos_id: int, seed: int = 0) -> None:
    """Random float32 weights of a Qwen3 model in safetensors, written tensor by tensor, with an
    unsampleable EOS. RMSNorm has no bias to aim at (`unsampleable_eos` uses GPT-2's), so one
    coordinate j of the residual stream is made a constant: every embedding row holds 0.1 there
    and no o_proj or down_proj row writes to it, so x_j = 0.1 at every layer and the final
    norm's output h_j = w_j x_j / rms(x) > 0 (0.03 at Qwen3-0.6B's shape, where rms(x) ends
    near 3). EOS's (tied) row is -3000 at j and 0 elsewhere, never an input: its logit
    -3000 h_j (about -90) lies far below every other, which share the same + 0.1 h_j."""
    shapes, j = qwen3_tensors(shape), 0
    header, offset = {}, 0
    for name, dims in shapes.items():
        size = 4 * math.prod(dims)
        header[name] = {"dtype": "F32", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    import torch
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, dims in shapes.items():
            if name.endswith("norm.weight"):
                t = 1 + 0.1 * torch.randn(dims, generator=gen)
                t[j] = 1.0 if name == "model.norm.weight" else t[j]
            else:
                t = torch.randn(dims, generator=gen) * 0.02
            if name == "model.embed_tokens.weight":
                t[:, j] = 0.1
                t[eos_id] = 0.0
                t[eos_id, j] = -3000.0
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                t[j] = 0.0
            f.write(t.numpy().tobytes())


def write_qwen3_fixture(folder: str, shape: dict = QWEN3, n_prompts: int = 200) -> str:
    """The Hugging Face folder both sides of a grpo_qwen3 part load, once: config.json (trl's
    EOS one past the rows, as in the GPT-2 parts), weights (`write_qwen3_checkpoint`), a BPE of
    shape["tokens"] ids for ours (<|endoftext|> the last: our EOS, made unsampleable; our PAD
    the first row no token uses), and prompts.jsonl of `n_prompts` texts of exactly 64 tokens.
    Checks that ours never prefers EOS on its prompts. Returns `folder`."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from gpt2_scale import texts_of_length, write_bpe_files
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    prompts_file = os.path.join(folder, "prompts.jsonl")
    if os.path.exists(prompts_file):  # written last: its presence means the rest is there
        return folder
    os.makedirs(folder, exist_ok=True)
    write_bpe_files(folder, shape["tokens"] - 257)
    write_qwen3_checkpoint(os.path.join(folder, "model.safetensors"), shape, eos_id=shape["tokens"] - 1)
    V = shape["vocab"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": V,
                   "hidden_size": shape["n_embd"], "intermediate_size": shape["mlp"],
                   "num_hidden_layers": shape["n_layer"], "num_attention_heads": shape["n_head"],
                   "num_key_value_heads": shape["n_kv_head"], "head_dim": shape["head_dim"],
                   "max_position_embeddings": shape["positions"], "rope_theta": shape["rope_theta"],
                   "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
                   "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
                   "sliding_window": None, "bos_token_id": V, "eos_token_id": V,
                   "pad_token_id": None}, f)  # an embedding padding_idx must be a row
    tok = BPETokenizer.from_pretrained(folder)
    prompts, seed = [], 0
    while len(prompts) < n_prompts:  # texts_of_length is +-1 token: keep the exact ones
        prompts += [p for p in texts_of_length(tok, GRPO["prompt"], n_prompts, seed)
                    if len(tok.encode(p)) == GRPO["prompt"]]
        seed += 1
    check_eos_unsampleable(folder, tok, prompts[:4])
    with open(prompts_file + ".part", "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts[:n_prompts])
    os.replace(prompts_file + ".part", prompts_file)
    return folder


def check_eos_unsampleable(folder: str, tok, prompts: list[str]) -> None:
    """EOS's log-probability at every position of `prompts` is below -30 (else a response of
    ours could end early: less work than trl's)."""
    import torch
    from mingpt_rlhf.model import GPT
    model = GPT.from_pretrained(folder, vocab_size=tok.vocab_size)
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(p) for p in prompts]))
    worst = float(torch.log_softmax(logits, -1)[..., tok.eos_id].max())
    if worst > -30:
        raise SystemExit(f"{folder}: EOS's log-probability reaches {worst:.1f}; it could be sampled")


def grpo_dir(shape: str) -> str:
    return os.path.join(FIXTURES, f"grpo_{shape}")


def grpo_fixture(shape: str) -> str:
    if shape.startswith("qwen3"):
        return write_qwen3_fixture(grpo_dir(shape), QWEN3 if shape == "qwen3" else QWEN3_TINY)
    return write_grpo_fixture(grpo_dir(shape), **GRPO_SHAPES[shape])


def grpo_argv(fixture: str, mode: str, iters: int, out_dir: str,
              prompts: int = GRPO["prompts"]) -> list[str]:
    """train_ppo's command line for a grpo part: the workload, then GRPO_EQUAL and the dtype
    (mode float32 / bfloat16), or nothing more (mode defaults: ours's own defaults), then what
    no step times (where the model, prompts and reward come from; evals only at the end)."""
    if mode not in ("float32", "bfloat16", "defaults"):
        raise ValueError(f"mode {mode!r}: float32, bfloat16 or defaults")
    settings = [] if mode == "defaults" else GRPO_EQUAL + OURS_LEAN + ["--dtype", mode]
    return grpo_flags(prompts) + settings + [
        "--init_from", fixture, "--prompts", os.path.join(fixture, "prompts.jsonl"),
        "--reward", f"{os.path.abspath(__file__)}:trivial_reward", "--device", "cpu",
        "--max_iters", str(iters), "--out_dir", out_dir,
        "--eval_prompts", "2", "--eval_interval", "1000", "--record_rollouts", "0"]


def ours_grpo(threads: int, shape: str, mode: str, warmup: int = 1, iters: int = 3,
              fixture: str = "") -> dict:
    """train_ppo.main on a grpo part: seconds of each step and its phases, the process's peak."""
    import torch
    torch.set_num_threads(threads)
    os.environ["MINGPT_RLHF_PLOT"] = "0"
    sys.path.insert(0, ROOT)
    import train_ppo
    from mingpt_rlhf.machinery.cli import parse_config
    fixture = fixture or grpo_fixture(shape)
    with tempfile.TemporaryDirectory(prefix="vs_peers_") as out_dir:  # its checkpoint
        argv = grpo_argv(fixture, mode, warmup + iters, out_dir, GRPO_PROMPTS.get(shape, GRPO["prompts"]))
        cfg = parse_config(train_ppo.Config, argv)
        result = timed_train_ppo(cfg, warmup)
    assert set(result["resp_len_all"]) == {GRPO["new"]}, f"a response ended early: {result['resp_len_all']}"
    result.update(shape=shape, mode=mode, dtype=cfg.dtype, argv=argv)
    return result


def ours_generate(threads: int, shape: str) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, ROOT)
    from mingpt_rlhf.model import GPT, GPTConfig
    from mingpt_rlhf.sampling import generate
    if shape == "tiny":
        config, rows, prompt, new, reps = GPTConfig(vocab_size=64, block_size=256, n_layer=4,
                                                    n_head=4, n_embd=128), 16, 32, 64, 10
    else:
        config = GPTConfig(vocab_size=GPT2["vocab"], block_size=1024, n_layer=12, n_head=12, n_embd=768)
        rows, prompt, new, reps = GPT2["rows"], GPT2["prompt"], GPT2["new"], 3
    torch.manual_seed(0)
    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (rows, prompt))
    g = torch.Generator().manual_seed(0)

    def seconds(n):
        generate(model, ids, max_new_tokens=n, generator=g)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = generate(model, ids, max_new_tokens=n, generator=g)
            times.append(time.perf_counter() - t)
            assert out.responses.shape == (rows, n)
        return statistics.median(times)
    total, prefill = seconds(new), seconds(1)
    return {"sec_per_generate": round(total, 5), "tokens_per_s": round(rows * new / total, 1),
            "prefill_s": round(prefill, 5), "decode_s": round(total - prefill, 5),
            "peak_rss_mb": round(peak_rss_mb(), 1), "threads": torch.get_num_threads()}


def cpu_model() -> str:
    """The CPU's model name (Linux), for the record of each part."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


# ----------------------------------------------------------------------------- floors
def machine_rates(threads: int) -> dict:
    """This machine's float32 GEMM rate at GPT-2's linear shapes (GFLOP/s, for M = the tokens
    of one minibatch and of one prompt batch) and its memory read bandwidth (GB/s)."""
    import torch
    torch.set_num_threads(threads)
    C = GPT2["n_embd"]

    def best(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)
    rates = {}
    for name, M in (("learn", GPT2["rows"] // 2 * (GPT2["prompt"] + GPT2["new"])),
                    ("prefill", GPT2["rows"] * GPT2["prompt"])):
        mats = [(torch.randn(M, i), torch.randn(o, i), torch.randn(M, o))
                for i, o in ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))]

        def run():
            for x, w, dy in mats:
                x @ w.t(), dy @ w, dy.t() @ x
        flop = sum(3 * 2 * M * w.shape[0] * w.shape[1] for _, w, _ in mats)
        rates[f"gemm_gflops_{name}"] = round(flop / best(run) / 1e9, 1)
    big = torch.randn(64 * 2**20)  # 256 MB: far past the caches
    rates["read_gb_per_s"] = round(big.numel() * 4 / best(lambda: big.sum()) / 1e9, 1)
    return rates


def output_layer_floors(rates: dict, shape: dict, prompts: int) -> dict:
    """Where a GRPO step's time goes at a large vocabulary: seconds the output layer alone
    needs in each phase, at this machine's measured GEMM rate and memory bandwidth. Its
    matmuls: decode reads the (V, C) matrix once per new token; score, the reference's logits
    of the response tokens (2 V C flops each); learn, the policy's forward and backward (6 V C).
    The log-softmax over V float32 columns per response token is memory-bound: about three
    passes over the (tokens, V) logits forward, three more backward. Also the output layer's
    share of one token's forward FLOPs, V C against the blocks' weights."""
    V, C = shape["vocab"], shape["n_embd"]
    tokens = prompts * GRPO["group"] * GRPO["new"]
    gemm, bandwidth = rates["gemm_gflops_learn"] * 1e9, rates["read_gb_per_s"] * 1e9
    logits_bytes = tokens * V * 4
    hs, q = shape["head_dim"], shape["n_head"] * shape["head_dim"]
    blocks = shape["n_layer"] * (C * (q + 2 * shape["n_kv_head"] * hs) + q * C + 3 * C * shape["mlp"])
    return {"decode": round((GRPO["new"] - 1) * V * C * 4 / bandwidth, 3),
            "score": round(2 * tokens * V * C / gemm + 3 * logits_bytes / bandwidth, 3),
            "learn": round(6 * tokens * V * C / gemm + 6 * logits_bytes / bandwidth, 3),
            "output_layer_flop_share": round(V * C / (V * C + blocks), 3)}


def gpt2_floors(rates: dict, lora: bool) -> dict:
    """Seconds each phase of the gpt2 part would take doing only its matrix multiplies at the
    measured GEMM rate (decode: only reading the weights at the measured bandwidth)."""
    C, L, V = GPT2["n_embd"], GPT2["n_layer"], 50304  # the padded vocabulary ours computes
    linear = L * 12 * C * C                           # weights of the blocks' four Linear layers
    R, T, N = GPT2["rows"], GPT2["prompt"], GPT2["new"]
    tokens = R * (T + N)
    gemm = rates["gemm_gflops_learn"] * 1e9
    # backward: input gradients always, weight gradients only of what trains (LoRA: adapters)
    backward = 2 if lora else 4
    return {
        "prefill": round(2 * linear * R * T / (rates["gemm_gflops_prefill"] * 1e9), 3),
        "decode": round((N - 1) * (linear + V * C) * 4 / (rates["read_gb_per_s"] * 1e9), 3),
        # reference (trunk + output layer at response positions) and reward model (trunk)
        "score": round((2 * 2 * linear * tokens + 2 * V * C * R * N) / gemm, 3),
        "learn": round(((2 + backward) * linear * tokens + (2 + backward) * V * C * R * N) / gemm, 3),
    }


# ----------------------------------------------------------------------------- the runs
PARTS = {  # part: (our worker's arguments, the peer's command-line arguments)
    "toy": (["toy"], ["trl_ppo.py", "--shape", "toy", "--max_grad_norm", "1.0"]),
    "gpt2": (["gpt2", "0"], ["trl_ppo.py", "--shape", "gpt2", "--max_grad_norm", "1.0"]),
    "gpt2_lora": (["gpt2", "16"], ["trl_ppo.py", "--shape", "gpt2", "--lora_rank", "16",
                                   "--max_grad_norm", "1.0"]),
    "gen_tiny": (["generate", "tiny"], ["hf_generate.py", "--shape", "tiny"]),
    "gen_gpt2": (["generate", "gpt2"], ["hf_generate.py", "--shape", "gpt2"]),
    **{f"grpo_{shape}{suffix}": (["grpo", shape, mode],
                                 ["trl_grpo.py", "--shape", shape, "--init_from", grpo_dir(shape), *trl,
                                  *(["--prompts", str(GRPO_PROMPTS[shape]), "--steps", str(QWEN3_STEPS)]
                                    if shape in GRPO_PROMPTS else [])])
       for shape in [*GRPO_SHAPES, "qwen3"]
       for suffix, mode, trl in (("", "float32", ["--dtype", "float32"]),
                                 ("_bf16", "bfloat16", ["--dtype", "bfloat16"]),
                                 ("_defaults", "defaults", ["--trl_defaults"]))},
}
DEFAULT_PARTS = [p for p in PARTS if "qwen3" not in p]  # Qwen3's: asked for by name
PEER_VENVS = {"trl_grpo.py": (PEER1_PY, "bench/peers/trl1/setup.sh")}  # else bench/peers/.venv


def peer_python(script: str) -> str:
    python, setup = PEER_VENVS.get(script, (PEER_PY, "bench/peers/setup.sh"))
    if not os.path.exists(python):
        raise SystemExit(f"no {os.path.relpath(os.path.dirname(os.path.dirname(python)), ROOT)}: "
                         f"run `bash {setup}` first")
    return python


def last_json(cmd: list[str], allow_oom: bool = False) -> dict:
    """The last JSON line `cmd` prints. With `allow_oom`, a process killed for memory (SIGKILL,
    the kernel's OOM killer, or a MemoryError) is a result: {"oom": True, ...}."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if allow_oom and (proc.returncode == -9 or "MemoryError" in proc.stderr
                      or "DefaultCPUAllocator: can't allocate" in proc.stderr):
        return {"oom": True, "returncode": proc.returncode, "stderr_tail": proc.stderr[-300:]}
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{' '.join(cmd)} failed: {' | '.join(tail)}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="*", choices=list(PARTS), default=DEFAULT_PARTS,
                    help="parts to run (default: all but Qwen3's)")
    ap.add_argument("--rounds", type=int, default=3, help="ours-then-peer rounds per part")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        kind, *rest = args.worker
        result = (ours_toy(args.threads) if kind == "toy" else
                  ours_gpt2(args.threads, int(rest[0])) if kind == "gpt2" else
                  ours_generate(args.threads, rest[0]) if kind == "generate" else
                  ours_grpo(args.threads, rest[0], rest[1], iters=QWEN3_STEPS if rest[0] in GRPO_PROMPTS else 3)
                  if kind == "grpo" else
                  machine_rates(args.threads))
        print(json.dumps(result))
        return
    for part in args.part:
        peer_python(PARTS[part][1][0])
    results = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            results = json.load(f)
    me = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads), "--worker"]
    if any(p.startswith("gpt2") for p in args.part):
        gpt2_fixtures()  # built once, not timed
    for shape in dict.fromkeys(PARTS[p][0][1] for p in args.part if p.startswith("grpo")):
        grpo_fixture(shape)  # likewise (Qwen3's: 2.4 GB of weights, a minute or two)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from results_file import measured
    rates = last_json(me + ["rates"])
    print("machine:", cpu_model(), json.dumps(rates), flush=True)
    import torch
    for part in args.part:
        ours_args, peer_args = PARTS[part]
        rounds = []
        for r in range(args.rounds):
            ours = last_json(me + ours_args, allow_oom="qwen3" in part)
            peer = last_json([peer_python(peer_args[0]), os.path.join(ROOT, "bench", "peers", peer_args[0]),
                              "--threads", str(args.threads), *peer_args[1:]], allow_oom="qwen3" in part)
            if "oom" in ours or "oom" in peer:  # a result: who ran out of memory at this batch
                rounds.append({"ours": ours, "peer": peer})
                print(json.dumps({"part": part, "round": r, "ours": ours, "peer": peer}), flush=True)
                continue
            key = "sec_per_generate" if part.startswith("gen") else "sec_per_iter"
            rounds.append({"ours": ours, "peer": peer,
                           "speedup": round(peer[key] / ours[key], 3),
                           "memory_ratio": round(peer["peak_rss_mb"] / ours["peak_rss_mb"], 3)})
            print(json.dumps({"part": part, "round": r, "ours_s": ours[key], "peer_s": peer[key],
                              "speedup": rounds[-1]["speedup"], "ours_peak_mb": ours["peak_rss_mb"],
                              "peer_peak_mb": peer["peak_rss_mb"]}), flush=True)
        if not all("speedup" in x for x in rounds):
            summary = {"oom": {side: [x[side].get("oom", False) for x in rounds] for side in ("ours", "peer")}}
            machine = {**rates, "threads": args.threads, "torch": torch.__version__,
                       "cpu": os.cpu_count(), "cpu_model": cpu_model(), "date": time.strftime("%Y-%m-%d"),
                       "measured": measured(ROOT), "command": " ".join(["python", *sys.argv])}
            results[part] = {"summary": summary, "rounds": rounds, "machine": machine}
            print(part, json.dumps(summary), flush=True)
            continue
        speedups = [x["speedup"] for x in rounds]
        memory = [x["memory_ratio"] for x in rounds]
        summary = {"speedup_median": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
                   "memory_ratio_median": statistics.median(memory),
                   "ours_peak_mb": statistics.median(x["ours"]["peak_rss_mb"] for x in rounds),
                   "peer_peak_mb": statistics.median(x["peer"]["peak_rss_mb"] for x in rounds)}
        if part == "gen_gpt2":
            floors = gpt2_floors(rates, lora=False)
            summary["floors_s"] = {k: floors[k] for k in ("prefill", "decode")}
            summary["ours_phases_s"] = {k: statistics.median(x["ours"][k] for x in rounds)
                                        for k in ("prefill_s", "decode_s")}
        if part.startswith("gpt2"):
            summary["floors_s"] = gpt2_floors(rates, lora=part == "gpt2_lora")
            summary["ours_phases_s"] = {k: statistics.median(x["ours"][k] for x in rounds)
                                        for k in ("t_generate", "t_score", "t_learn")}
        if part.startswith("grpo"):
            for side in ("ours", "peer"):
                summary[f"{side}_phases_s"] = {k: statistics.median(x[side][k] for x in rounds)
                                               for k in ("t_generate", "t_score", "t_learn")}
        if part.startswith("grpo_qwen3"):
            summary["output_layer_floors_s"] = output_layer_floors(rates, QWEN3, QWEN3_PROMPTS)
        machine = {**rates, "threads": args.threads, "torch": torch.__version__,
                   "cpu": os.cpu_count(), "cpu_model": cpu_model(), "date": time.strftime("%Y-%m-%d"),
                   "measured": measured(ROOT), "command": " ".join(["python", *sys.argv])}
        # each part keeps the machine and day that measured it (parts are re-run separately)
        results[part] = {"summary": summary, "rounds": rounds, "machine": machine}
        print(part, json.dumps(summary), flush=True)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
