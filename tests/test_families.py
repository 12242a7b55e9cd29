"""Today's families in our GPT (Llama 3 / SmolLM2, Qwen2 / 2.5, Qwen3), without transformers:
parity with the reference implementation through the fixtures bench/parity_models.py wrote
(its logits and greedy tokens), the parts each fixture exercises, the KV cache by key/value
heads, left padding and packing with rotary positions, the vocabulary's columns, LoRA's names,
and every refusal of a checkpoint we cannot load exactly."""
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from conftest import exits_2
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.machinery.families import WEIGHT_NAMES
from mingpt_rlhf.machinery.lora import add_lora, merged_state_dict
from mingpt_rlhf.machinery.pretrained import copy_weights, read_safetensors
from mingpt_rlhf.model import GPT, GPTConfig, KVCache, RotaryAttention
from mingpt_rlhf.sampling import generate
from test_pretrained import write_safetensors

FIXTURES = Path(__file__).parent / "fixtures" / "models"
NAMES = ("llama_tiny", "qwen2_tiny", "qwen3_tiny")
ATOL = RTOL = 1e-4   # the bench's tolerance, float32
TIE = 1e-3           # the bench's: two best logits this close may swap under float rounding


def reference(name):
    return read_safetensors(FIXTURES / name / "reference.safetensors")


def config_of(folder):
    return json.loads((Path(folder) / "config.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_greedy_tokens_match_the_reference(name):
    """Left-padded logits at every real position, and 32 greedy tokens decoded with our KV
    cache, equal to transformers' on the same weights (bench/parity_models.py)."""
    ref = reference(name)
    model = GPT.from_pretrained(str(FIXTURES / name))
    ids, mask = ref["ids"], ref["mask"]
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(logits[real], ref["logits"][real], atol=ATOL, rtol=RTOL)
    out = generate(model, ids, mask, max_new_tokens=ref["greedy"].shape[1], temperature=0)
    compared = 0
    for row in range(len(ids)):
        for t in range(ref["greedy"].shape[1]):
            if out.responses[row, t] != ref["greedy"][row, t]:
                assert ref["gap"][row, t] <= TIE, f"row {row} step {t}: not a tie, yet other tokens"
                break
            compared += 1
    assert compared >= 0.9 * ref["greedy"].numel()  # the check compared (nearly) every token


def test_each_fixture_exercises_its_familys_parts():
    """What the parity above covers: the llama3 rope scaling and an untied output layer in a
    float32 file (Llama), q/k/v biases in two bfloat16 shards (Qwen2), q/k norms and a head
    width of its own in a float16 file (Qwen3); config.json in the published layout
    (rope_theta, rope_scaling) for Llama and in transformers 5's (rope_parameters) for Qwen."""
    llama, qwen2, qwen3 = (GPT.from_pretrained(str(FIXTURES / n)) for n in NAMES)
    assert llama.config.rope_scaling["factor"] == 8.0 and not llama.config.tie_embeddings
    assert llama.lm_head.weight is not llama.transformer.wte.weight
    assert "rope_scaling" in config_of(FIXTURES / "llama_tiny")
    assert qwen2.transformer.h[0].attn.c_attn.bias is not None and qwen2.config.tie_embeddings
    assert qwen2.lm_head.weight is qwen2.transformer.wte.weight
    assert len(list((FIXTURES / "qwen2_tiny").glob("model-0000*.safetensors"))) == 2
    assert qwen3.config.qk_norm and qwen3.config.head_dim * qwen3.config.n_head != qwen3.config.n_embd
    assert "rope_parameters" in config_of(FIXTURES / "qwen3_tiny")
    dtypes = {n: {t.dtype for f in (FIXTURES / n).glob("model*.safetensors")
                  for t in read_safetensors(f).values()} for n in NAMES}
    assert dtypes == {"llama_tiny": {torch.float32}, "qwen2_tiny": {torch.bfloat16},
                      "qwen3_tiny": {torch.float16}}
    for model in (llama, qwen2, qwen3):  # grouped heads and no learned positions in each
        assert model.config.n_kv_head < model.config.n_head and "wpe" not in model.transformer
        # every norm weight and bias was perturbed away from 1 and 0 before saving
        for name, p in model.named_parameters():
            assert not torch.all(p == (1 if "ln" in name or "norm" in name else 0)), name


def test_kv_cache_holds_the_key_value_heads():
    model = GPT.from_pretrained(str(FIXTURES / "qwen3_tiny"))
    cfg = model.config
    cache = model.new_kv_cache(3, 10)
    assert cache.kv.shape == (cfg.n_layer, 2, 3, cfg.n_kv_head, 10, cfg.head_dim)
    idx = torch.randint(0, cfg.vocab_size, (3, 10))
    with torch.no_grad():
        full = model(idx)
        steps = [model(idx[:, :4], kv_cache=cache)] + [model(idx[:, t:t + 1], kv_cache=cache)
                                                        for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


def tiny_modern(**kw):
    torch.manual_seed(0)
    cfg = GPTConfig(**{**dict(vocab_size=40, block_size=64, n_layer=2, n_head=4, n_embd=32,
                              bias=False, rope_theta=10000.0, rms_norm_eps=1e-6, mlp_hidden=48,
                              n_kv_head=2, head_dim=16, qkv_bias=True, qk_norm=True,
                              tie_embeddings=False), **kw})
    return GPT(cfg).eval()


def test_rotary_positions_count_real_tokens_with_left_padding_and_packing():
    """A left-padded row gets the logits it gets alone (its positions start at 0 at its first
    real token, in the rotary tables too), in the padded pass and in the packed one
    (machinery/packing.py, taken when most of a batch is padding)."""
    model = tiny_modern()
    rows = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [9, 10], [11, 12, 13], [5], [6, 7]]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, T - len(r):], mask[i, T - len(r):] = torch.tensor(r), 1
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)           # mostly padding: the packed path
        unpacked = model(ids[:3], attention_mask=mask[:3])  # less: the masked path
        for i, r in enumerate(rows):
            alone = model(torch.tensor([r]))[0]
            torch.testing.assert_close(padded[i, T - len(r):], alone, atol=1e-5, rtol=0)
            if i < 3:
                torch.testing.assert_close(unpacked[i, T - len(r):], alone, atol=1e-5, rtol=0)


def test_gpt2s_defaults_and_old_checkpoints_are_unchanged():
    """GPTConfig's new fields default to GPT-2's parts, and a config saved before they
    existed loads into the same model (same parameter names and shapes)."""
    old = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0,
               bias=True, vocab_multiple=64)
    cfg = GPTConfig(**old)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.mlp_hidden, cfg.qk_norm, cfg.qkv_bias) == \
        (None, None, None, False, False)
    assert (cfg.n_kv_head, cfg.head_dim, cfg.tie_embeddings, cfg.padded_vocab_size) == (4, 8, True, 64)
    model = GPT(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["transformer.wpe.weight"] == (16, 32) and shapes["transformer.h.0.attn.c_attn.weight"] == (96, 32)
    assert isinstance(model.transformer.ln_f, torch.nn.LayerNorm) and model.lm_head.weight is model.transformer.wte.weight
    assert GPTConfig(**asdict(cfg)) == cfg  # a checkpoint's saved config reads back the same


def copy_fixture(name, tmp_path):
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def test_the_tokenizers_ids_are_the_columns_and_rows_without_a_token_never_sampled(tmp_path):
    """Qwen's embedding has rows no token uses: with a tokenizer of 90 ids in the folder,
    logits() returns 90 columns (the reference's first 90), the file's 96 rows stay (padded to
    a multiple of 64), and no sample is ever >= 90."""
    folder = copy_fixture("qwen3_tiny", tmp_path)
    (folder / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(90)}))
    model = GPT.from_pretrained(str(folder))
    assert model.config.vocab_size == 90 and model.config.embedding_rows == 96
    assert model.transformer.wte.weight.shape[0] == 128
    ref = reference("qwen3_tiny")
    with torch.no_grad():
        logits = model(ref["ids"], attention_mask=ref["mask"])
    real = ref["mask"].bool()
    assert logits.shape[-1] == 90
    torch.testing.assert_close(logits[real], ref["logits"][real][:, :90], atol=ATOL, rtol=RTOL)
    g = torch.Generator().manual_seed(0)
    out = generate(model, ref["ids"].repeat(8, 1), ref["mask"].repeat(8, 1), max_new_tokens=40,
                   temperature=2.0, generator=g)
    assert int(out.responses.max()) < 90


def test_a_larger_vocabulary_adds_mean_rows_to_both_embedding_and_untied_output_layer():
    """Llama's every row holds a token, so our BPE's PAD is a new row: set to the mean of the
    file's rows, in the embedding and in the untied output layer; old ids' logits unchanged."""
    model = GPT.from_pretrained(str(FIXTURES / "llama_tiny"), vocab_size=97)
    file = read_safetensors(FIXTURES / "llama_tiny" / "model.safetensors")
    for ours, theirs in (("transformer.wte.weight", "model.embed_tokens.weight"),
                         ("lm_head.weight", "lm_head.weight")):
        rows = model.state_dict()[ours]
        assert rows.shape[0] == 128
        assert torch.equal(rows[:96], file[theirs])
        torch.testing.assert_close(rows[96:], file[theirs].mean(0).expand(32, -1))
    ref = reference("llama_tiny")
    with torch.no_grad():
        logits = model(ref["ids"], attention_mask=ref["mask"])
    real = ref["mask"].bool()
    torch.testing.assert_close(logits[real][:, :96], ref["logits"][real], atol=ATOL, rtol=RTOL)


def test_lora_adapts_the_stacked_projections_and_merges_exactly():
    """LoRA's names are ours in every family (c_attn = q, k, v; c_fc = gate, up; c_proj =
    o, down); a checkpoint's name is refused with where it lives; the merged weights of an
    adapted model give the adapted model's logits."""
    model = GPT.from_pretrained(str(FIXTURES / "qwen2_tiny"))
    with pytest.raises(UserError, match=r"q_proj is part of our c_attn.*choose among c_attn,c_fc,c_proj"):
        add_lora(model, 4, 8.0, ("q_proj", "c_fc"))
    assert add_lora(model, 4, 8.0) == 4 * model.config.n_layer  # c_attn, c_proj x 2, c_fc
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if name.endswith("lora_B"):
            p.data.normal_(0, 0.5)
    ids = reference("qwen2_tiny")["ids"]
    merged = GPT(model.config).eval()
    merged.load_state_dict(merged_state_dict(model))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), model(ids), atol=1e-5, rtol=1e-5)


def test_an_untied_output_layer_stays_float32_when_the_frozen_base_is_held_in_bf16():
    """LoRA under bf16 holds the frozen Linear weights in bf16 (runtime.hold_frozen_in); the
    output layer, tied (GPT-2, Qwen) or not (this Llama), computes the float32 logits."""
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    model = GPT.from_pretrained(str(FIXTURES / "llama_tiny"))
    add_lora(model, 4, 8.0)
    hold_frozen_in(model, torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.float32
    assert model.transformer.h[0].mlp.c_fc.weight.dtype == torch.bfloat16


def test_bfloat16_autocast_runs_the_modern_parts_close_to_float32():
    model = GPT.from_pretrained(str(FIXTURES / "qwen3_tiny"))
    ref = reference("qwen3_tiny")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ref["ids"], attention_mask=ref["mask"])
        out = generate(model, ref["ids"], ref["mask"], max_new_tokens=4, temperature=0)
    real = ref["mask"].bool()
    assert logits.dtype == torch.float32 and out.responses.shape == (3, 4)
    assert (logits[real] - ref["logits"][real]).abs().max() < 0.1  # bf16 rounding, not a bug


# ---- bad input: refused in one line, nothing loaded partly -----------------------------------

def edit_config(folder, **changes):
    hparams = config_of(folder)
    hparams.update(changes)
    (folder / "config.json").write_text(json.dumps(hparams))


def edit_weights(folder, change):
    path = folder / "model.safetensors"
    tensors = {k: v.clone() for k, v in read_safetensors(path).items()}
    change(tensors)
    write_safetensors(path, tensors)


BAD = {  # what is wrong -> (fixture, how to break it, the words of the refusal)
    "sliding window on": ("qwen2_tiny", lambda f: edit_config(f, use_sliding_window=True, sliding_window=8),
                          "sliding-window attention is switched on"),
    "experts": ("qwen3_tiny", lambda f: edit_config(f, num_experts=8), "a mixture of experts"),
    "yarn rope scaling": ("qwen3_tiny", lambda f: edit_config(
        f, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "rope scaling 'yarn'"),
    "llama attention bias": ("llama_tiny", lambda f: edit_config(f, attention_bias=True),
                             "attention_bias is true"),
    "unknown family": ("llama_tiny", lambda f: edit_config(f, model_type="mistral"),
                       "model_type 'mistral' is not a family"),
    "missing key": ("llama_tiny", lambda f: edit_config(f, hidden_size=None), "no 'hidden_size'"),
    "missing shard": ("qwen2_tiny", lambda f: os.remove(f / "model-00002-of-00002.safetensors"),
                      "names the shard model-00002-of-00002.safetensors"),
    "wrong shape": ("qwen3_tiny", lambda f: edit_config(f, intermediate_size=41),
                    r"has shape \(\d+, \d+\) but config.json gives"),
    "unknown tensor": ("qwen3_tiny", lambda f: edit_weights(
        f, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)})),
        "'model.layers.0.mlp.extra.weight' has no place"),
    "a layer too many": ("qwen3_tiny", lambda f: edit_config(f, num_hidden_layers=1),
                         r"'model.layers.1.\S+' has no place"),
    "a bias the family lacks": ("qwen3_tiny", lambda f: edit_weights(
        f, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32, dtype=torch.float16)})),
        "'model.layers.0.self_attn.q_proj.bias' has no place"),
    "missing tensor": ("qwen3_tiny", lambda f: edit_weights(
        f, lambda t: t.pop("model.layers.1.self_attn.o_proj.weight")), "no tensor for h.1.attn.c_proj.weight"),
    "half a stack": ("qwen3_tiny", lambda f: edit_weights(
        f, lambda t: t.pop("model.layers.0.self_attn.v_proj.weight")), "not every tensor stacked"),
    "quantized": ("qwen3_tiny", lambda f: edit_weights(
        f, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int8)})), "not a float"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_checkpoint_we_cannot_load_exactly_is_refused(case, tmp_path):
    name, breaking, words = BAD[case]
    folder = copy_fixture(name, tmp_path)
    breaking(folder)
    with pytest.raises(UserError, match=words) as e:
        GPT.from_pretrained(str(folder))
    assert "\n" not in str(e.value)


def test_a_feature_that_is_present_but_off_loads(tmp_path):
    """Qwen's config.json files carry a sliding window with use_sliding_window false, and
    attention_bias false: present, off, fine."""
    folder = copy_fixture("qwen2_tiny", tmp_path)
    edit_config(folder, use_sliding_window=False, sliding_window=4096, max_window_layers=1,
                attention_bias=False, rope_scaling=None)
    GPT.from_pretrained(str(folder))


def test_nothing_is_copied_when_any_tensor_does_not_fit():
    params = {"a": torch.nn.Parameter(torch.zeros(2, 3)), "b": torch.nn.Parameter(torch.zeros(4))}
    tensors = {"a": torch.ones(2, 3), "b": torch.ones(5)}
    with pytest.raises(UserError, match="'b' has shape"):
        copy_weights(params, tensors, {"a": "a", "b": "b"}, "w.safetensors")
    assert not params["a"].any()


@pytest.mark.parametrize("script", ["train_sft", "train_rm", "train_ppo", "train_dpo", "sample"])
def test_every_script_refuses_a_bad_folder_with_exit_2_and_one_line(script, tmp_path, capsys):
    from test_bpe import make_files  # the tokenizer is read first: a good one
    folder = make_files(copy_fixture("qwen3_tiny", tmp_path))
    edit_config(folder, use_sliding_window=True, sliding_window=8)
    extra = ["--prompt", "the"] if script == "sample" else ["--out_dir", str(tmp_path / "out")]
    line = exits_2(capsys, script, ["--init_from", str(folder), *extra])
    assert "sliding-window attention is switched on" in line


def test_the_weight_table_covers_every_parameter_of_each_family():
    """Every parameter of a model of each family has a checkpoint name in WEIGHT_NAMES."""
    ours = {o.replace(".N.", ".0.") for o, _ in WEIGHT_NAMES.values()}
    for name in NAMES:
        model = GPT.from_pretrained(str(FIXTURES / name))
        for p in dict(model.named_parameters()):
            assert p.replace(".1.", ".0.") in ours, (name, p)
    assert isinstance(model.transformer.h[0].attn, RotaryAttention) and KVCache
