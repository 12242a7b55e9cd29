"""Every script on today's families at tiny size: a Llama 3, a Qwen2 and a Qwen3 folder that
the test writes (random weights under the Hugging Face names, config.json, and a GPT-2-style
vocab.json + merges.txt so that text goes in and out), through SFT -> RM -> PPO, GRPO, RLOO,
DPO and sample.py, with LoRA, bf16, killed and resumed runs, and two processes. No network.

The Qwen folders' embeddings have 40 rows that no token uses (as Qwen's 151,936 rows hold
~151,670 tokens): the tokenizer's PAD is the first of them. Llama's rows are all tokens: PAD
is a new row. One family per row runs in the default suite, the others with `-m slow` (a row's
code is the same for every family; what differs between families is test_families.py's):

    row                                                              default   -m slow
    SFT (bf16, LoRA, killed + resumed) -> RM (bf16) -> PPO (bf16,
        LoRA) -> sample.py                                           qwen3     llama, qwen2
    GRPO from --init_from (a reward function, float32); RLOO from
        --init_from (bf16, LoRA, killed + resumed)                   llama     qwen2, qwen3
    DPO from --init_from (LoRA) -> sample.py --init_from             qwen2     llama, qwen3
    torchrun, 2 processes: SFT equals one process with the whole
        batch; GRPO runs                                             -         qwen3
"""
import json
import os

import pytest
import torch

import sample
import train_dpo
import train_ppo
import train_rm
import train_sft
from mingpt_rlhf.run.metrics import read_metrics
from mingpt_rlhf.tokenizer import tokenizer_from_state
from test_bpe import make_files
from test_gpt2_scripts import DIALOGUES, write_jsonl
from test_matrix import FIRST_MINIBATCH_KL, check_run, straight_and_resumed
from test_pretrained import write_safetensors

BF16 = "bfloat16"
BASE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
            hidden_act="silu")
FAMILY = {  # config.json beyond BASE; "rows": embedding rows beyond the tokenizer's ids
    "llama": dict(rows=0, tie_word_embeddings=False, rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=32)),
    "qwen2": dict(rows=40, tie_word_embeddings=True, rope_theta=1000000.0,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=1),
    "qwen3": dict(rows=40, tie_word_embeddings=True, rope_theta=1000000.0, head_dim=16,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
}


def rows_of(default: str):
    """The three families, all but `default` marked slow."""
    return [pytest.param(f, marks=() if f == default else pytest.mark.slow) for f in FAMILY]


def hf_weights(hp: dict, seed: int) -> dict:
    """Random weights under the Hugging Face names for config `hp`: matrices of std 0.1, norm
    weights around 1, Qwen2's q/k/v biases around 0."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, std=0.1: torch.randn(*shape, generator=g) * std
    C, H, V = hp["hidden_size"], hp["intermediate_size"], hp["vocab_size"]
    hs = hp.get("head_dim") or C // hp["num_attention_heads"]
    q, kv = hp["num_attention_heads"] * hs, hp["num_key_value_heads"] * hs
    w = {"model.embed_tokens.weight": rnd(V, C), "model.norm.weight": 1 + rnd(C)}
    if not hp["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(V, C)
    for i in range(hp["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rnd(C), p + "post_attention_layernorm.weight": 1 + rnd(C),
                  p + "self_attn.q_proj.weight": rnd(q, C), p + "self_attn.k_proj.weight": rnd(kv, C),
                  p + "self_attn.v_proj.weight": rnd(kv, C), p + "self_attn.o_proj.weight": rnd(C, q),
                  p + "mlp.gate_proj.weight": rnd(H, C), p + "mlp.up_proj.weight": rnd(H, C),
                  p + "mlp.down_proj.weight": rnd(C, H)})
        if hp["model_type"] == "qwen2":
            w.update({p + f"self_attn.{x}_proj.bias": rnd(n) for x, n in (("q", q), ("k", kv), ("v", kv))})
        if hp["model_type"] == "qwen3":
            w.update({p + "self_attn.q_norm.weight": 1 + rnd(hs), p + "self_attn.k_norm.weight": 1 + rnd(hs)})
    return w


def write_family_folder(folder, family: str, seed: int = 0):
    """A Hugging Face folder of `family` at tiny size, with a GPT-2-style tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    make_files(folder)
    ids = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    extra = dict(FAMILY[family])
    hp = dict(BASE, model_type=family, vocab_size=ids + extra.pop("rows"), **extra)
    write_safetensors(folder / "model.safetensors", hf_weights(hp, seed))
    (folder / "config.json").write_text(json.dumps(hp))
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder per family, and the user data: demonstrations, preference pairs, prompts, a
    reward function."""
    root = tmp_path_factory.mktemp("families")
    folders = {f: write_family_folder(root / f, f) for f in FAMILY}
    data = dict(
        demos=write_jsonl(root / "demos.jsonl", [{"prompt": p, "response": r} for p, r in DIALOGUES] * 8),
        prefs=write_jsonl(root / "prefs.jsonl",
                          [{"prompt": p, "chosen": r, "rejected": " no."} for p, r in DIALOGUES] * 8),
        prompts=write_jsonl(root / "prompts.jsonl", [{"prompt": p} for p, _ in DIALOGUES] * 3))
    reward = root / "reward.py"
    reward.write_text("def score(prompts, responses):\n"
                      "    return [sum(c in 'aeiou' for c in r) / max(len(r), 1) for r in responses]\n")
    return folders, data, f"{reward}:score"


def sample_prompts(capsys, **where):
    rows = sample.main(sample.Config(prompt="Human: say hello\n\nAssistant:", num_samples=2,
                                     max_new_tokens=8, **where))
    assert len(rows) == 2 and "Human: say hello" in capsys.readouterr().out
    return rows


RL = dict(max_iters=2, rollout_batch_size=4, minibatch_size=2, ppo_epochs=1, max_new_tokens=8,
          eval_interval=1, eval_prompts=4)


@pytest.mark.parametrize("family", rows_of("qwen3"))
def test_sft_rm_ppo_and_sample(family, world, tmp_path, monkeypatch, capsys, first_minibatch_kl):
    folders, data, _ = world
    lora = dict(dtype=BF16, lora_rank=4, lora_alpha=8.0)
    make_sft = lambda out, **kw: train_sft.Config(
        out_dir=str(out), init_from=str(folders[family]), data=data["demos"], max_iters=4,
        eval_interval=2, batch_size=4, warmup_iters=1, max_new_tokens=8, eval_prompts=4,
        grad_checkpoint=True, **lora, **kw)
    summary, _ = straight_and_resumed(monkeypatch, train_sft, make_sft, tmp_path / "sft")
    sft = tmp_path / "sft" / "killed"
    check_run(sft, summary)
    ckpt = torch.load(sft / "ckpt.pt", weights_only=False)
    tok = tokenizer_from_state(ckpt["tokenizer"])
    config = ckpt["model_config"]
    assert config["vocab_size"] == tok.vocab_size == tok.pad_id + 1  # PAD is the last column
    assert config["rope_theta"] == FAMILY[family]["rope_theta"] and config["n_kv_head"] == 2
    ids = tok.pad_id  # the tokenizer's own ids; PAD is the first id without a token
    file_rows = ids + FAMILY[family]["rows"]
    assert (tok.pad_id < file_rows) == (family != "llama")  # Qwen: a row of the file; Llama: new
    rows = ckpt["model"]["transformer.wte.weight"].shape[0]
    assert rows == -(-max(file_rows, ids + 1) // 64) * 64

    rm = train_rm.main(train_rm.Config(out_dir=str(tmp_path / "rm"), sft_dir=str(sft),
                                       data=data["prefs"], batch_size=4, eval_interval=4,
                                       norm_samples=4, max_new_tokens=8, dtype=BF16))
    check_run(tmp_path / "rm", rm)
    ppo = train_ppo.main(train_ppo.Config(
        out_dir=str(tmp_path / "ppo"), sft_dir=str(sft), rm_dir=str(tmp_path / "rm"),
        prompts=data["prompts"], ptx_data=data["demos"], **RL, **lora))
    check_run(tmp_path / "ppo", ppo, rl=True)
    assert first_minibatch_kl and max(map(abs, first_minibatch_kl)) < FIRST_MINIBATCH_KL
    sample_prompts(capsys, ckpt_dir=str(tmp_path / "ppo"))


@pytest.mark.parametrize("family", rows_of("llama"))
def test_grpo_and_rloo_from_the_folder(family, world, tmp_path, monkeypatch, first_minibatch_kl):
    folders, data, reward = world
    grpo = train_ppo.main(train_ppo.Config(
        out_dir=str(tmp_path / "grpo"), init_from=str(folders[family]), reward=reward,
        prompts=data["prompts"], algo="grpo", group_size=2, **RL))
    check_run(tmp_path / "grpo", grpo, rl=True)
    saved = torch.load(tmp_path / "grpo" / "ckpt.pt", weights_only=False)["model_config"]
    assert saved["rope_theta"] == FAMILY[family]["rope_theta"] and saved["n_kv_head"] == 2
    make = lambda out, **kw: train_ppo.Config(
        out_dir=str(out), init_from=str(folders[family]), reward=reward, prompts=data["prompts"],
        algo="rloo", group_size=2, dtype=BF16, lora_rank=4, lora_alpha=8.0, **RL, **kw)
    summary, _ = straight_and_resumed(monkeypatch, train_ppo, make, tmp_path / "rloo")
    check_run(tmp_path / "rloo" / "killed", summary, rl=True)
    assert first_minibatch_kl and max(map(abs, first_minibatch_kl)) < FIRST_MINIBATCH_KL


@pytest.mark.parametrize("family", rows_of("qwen2"))
def test_dpo_and_sample_from_the_folder(family, world, tmp_path, capsys):
    folders, data, _ = world
    dpo = train_dpo.main(train_dpo.Config(
        out_dir=str(tmp_path / "dpo"), init_from=str(folders[family]), data=data["prefs"],
        batch_size=4, eval_interval=2, warmup_iters=1, lora_rank=4, lora_alpha=8.0,
        max_new_tokens=8, eval_prompts=4))
    check_run(tmp_path / "dpo", dpo)
    evals = [r for r in read_metrics(tmp_path / "dpo" / "metrics.jsonl") if r.get("split") == "eval"]
    assert evals[0]["step"] == 0 and evals[0]["kl"] == 0.0  # the reference is the folder's model
    rows = sample_prompts(capsys, init_from=str(folders[family]))
    assert all(str(folders[family]) in r for r in rows)  # answered by the folder's model
    sample_prompts(capsys, ckpt_dir=str(tmp_path / "dpo"))


@pytest.mark.slow
def test_two_processes_on_a_family(world, tmp_path):
    """torchrun: SFT from a Qwen3 folder on 2 processes x 4 equals 1 process x 8; GRPO runs."""
    from test_distributed import assert_same_weights, metrics, options, torchrun, weights
    folders, data, reward = world
    sft = dict(init_from=folders["qwen3"], data=data["demos"], max_iters=4, eval_interval=2,
               warmup_iters=1, max_new_tokens=8, eval_prompts=4)
    train_sft.main(train_sft.Config(out_dir=str(tmp_path / "one"), batch_size=8, **sft))
    jobs = [["run", tmp_path, "train_sft", *options(out_dir=tmp_path / "two", batch_size=4, **sft)],
            ["run", tmp_path, "train_ppo", *options(out_dir=tmp_path / "grpo", init_from=folders["qwen3"],
                                                    reward=reward, prompts=data["prompts"], algo="grpo",
                                                    group_size=2, **{**RL, "rollout_batch_size": 8})]]
    with open(tmp_path / "jobs.json", "w") as f:
        json.dump([[str(x) for x in job] for job in jobs], f)
    torchrun("jobs", tmp_path / "jobs.json", None)
    for key in ("loss", "eval_loss"):
        one, two = metrics(tmp_path / "one", key), metrics(tmp_path / "two", key)
        assert [s for s, _ in one] == [s for s, _ in two] and one
        for (_, a), (_, b) in zip(one, two):
            assert a == pytest.approx(b, abs=2e-5), key
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"), atol=2e-5)
    assert read_metrics(os.path.join(tmp_path, "grpo", "metrics.jsonl"))[-1]["final"]
