"""The export to a Hugging Face folder (run/export.py), without transformers:
- the files it writes from committed checkpoints are, file for file and tensor for tensor, the
  ones transformers loaded with our logits in bench/export_parity.py, and our loader reads
  them with the logits transformers computed from them (its fixtures, tests/fixtures/exports);
- a round trip through our own loader gives every token's logits exactly, and the same
  tokenizer, for GPT-2 (with and without biases) and each family, LoRA merged;
- what happens to PAD's row, the word tokenizer's folder, the dtype, every refusal (exit
  status 2, one line), and the atomic write;
- the whole way from a family's folder with its tokenizer: SFT on `messages`, a reward model,
  GRPO, the export, and the exported folder read back as the next run would read it."""
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from conftest import bench_module
from mingpt_rlhf.run import export as export_module
from mingpt_rlhf.stages import load_policy
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.run.export import export, load_policy_checkpoint
from mingpt_rlhf.run.export import main as export_main
from mingpt_rlhf.machinery.lora import add_lora, merged_state_dict
from mingpt_rlhf.machinery.pretrained import read_safetensors, write_safetensors
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.sampling import generate
from mingpt_rlhf.tokenizer import BPETokenizer, WordTokenizer, same_tokenizer, tokenizer_from_state

FIXTURES = Path(__file__).parent / "fixtures"
EXPORTS = FIXTURES / "exports"
CASES = ("gpt2_tiny", "gpt2_word", "llama_tiny", "qwen2_tiny", "qwen3_tiny")
ATOL = RTOL = 1e-4   # the bench's tolerance, float32
TIE = 1e-3           # the bench's: two best logits this close may swap under float rounding


# ---- the fixtures: what transformers loaded ------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_the_export_is_the_folder_transformers_loaded_with_our_logits(case, tmp_path, capsys):
    """The command on the committed checkpoint writes the files bench/export_parity.py saw
    transformers load (the same names, config.json, generation_config.json, tensors and
    tokenizer files); our GPT.from_pretrained of them computes transformers' logits at every
    real position of a left-padded batch, and its greedy tokens (bar ties)."""
    out = tmp_path / "hf"
    export_main([str(EXPORTS / case / "ckpt.pt"), str(out)])
    assert f"wrote {out}" in capsys.readouterr().out
    expected = json.loads((EXPORTS / case / "expected.json").read_text(encoding="utf-8"))
    assert bench_module("export_parity").expected_files(str(out)) == expected
    ref = read_safetensors(EXPORTS / case / "reference.safetensors")
    tokenizer = tokenizer_from_state(torch.load(EXPORTS / case / "ckpt.pt", weights_only=False)["tokenizer"])
    model = GPT.from_pretrained(str(out), vocab_size=tokenizer.vocab_size)
    ids, mask = ref["ids"], ref["mask"]
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)[mask.bool()]
    columns = min(logits.shape[-1], ref["logits"].shape[-1])
    assert columns >= tokenizer.n_tokens  # every token's column is compared
    torch.testing.assert_close(logits[:, :columns], ref["logits"][:, :columns], atol=ATOL, rtol=RTOL)
    greedy = generate(model, ids, mask, max_new_tokens=ref["greedy"].shape[1], temperature=0,
                      pad_token_id=tokenizer.pad_id).responses
    compared = 0
    for row in range(len(ids)):
        for t in range(ref["greedy"].shape[1]):
            if greedy[row, t] != ref["greedy"][row, t]:
                assert ref["gap"][row, t] <= TIE, f"row {row} step {t}: not a tie, yet other tokens"
                break
            compared += 1
    assert compared >= 0.9 * ref["greedy"].numel()


def test_the_fixtures_cover_each_layout_and_pad_decision():
    """What the fixtures above hold: GPT-2's Conv1D layout with vocab.json + merges.txt and with
    the word tokenizer (no tokenizer files), Llama's untied output layer and llama3 rope
    scaling, Qwen2's biases from a LoRA run, Qwen3's q/k norms; PAD's row dropped where it was
    a new row (GPT-2, Llama), kept where it is one of the embedding's (Qwen)."""
    expected = {case: json.loads((EXPORTS / case / "expected.json").read_text(encoding="utf-8"))
                for case in CASES}
    ckpts = {case: torch.load(EXPORTS / case / "ckpt.pt", weights_only=False) for case in CASES}
    toks = {case: tokenizer_from_state(c["tokenizer"]) for case, c in ckpts.items()}
    assert "transformer.h.0.attn.c_attn.weight" in expected["gpt2_tiny"]["tensors"]
    assert {"vocab.json", "merges.txt"} <= set(expected["gpt2_tiny"]["files"])
    assert expected["gpt2_word"]["files"] == ["config.json", "generation_config.json", "model.safetensors"]
    assert expected["llama_tiny"]["config"]["rope_scaling"]["rope_type"] == "llama3"
    assert "lm_head.weight" in expected["llama_tiny"]["tensors"]
    assert "model.layers.0.self_attn.q_proj.bias" in expected["qwen2_tiny"]["tensors"]
    assert ckpts["qwen2_tiny"]["model_config"]["qkv_bias"]
    assert "model.layers.0.self_attn.q_norm.weight" in expected["qwen3_tiny"]["tensors"]
    for case in ("gpt2_tiny", "llama_tiny"):  # PAD was a new row: not written
        assert expected[case]["config"]["vocab_size"] == toks[case].n_tokens == toks[case].pad_id
    for case in ("qwen2_tiny", "qwen3_tiny"):  # PAD is a row of the embedding: all written
        rows = ckpts[case]["model_config"]["embedding_rows"]
        assert expected[case]["config"]["vocab_size"] == rows > toks[case].pad_id >= toks[case].n_tokens
    assert expected["gpt2_word"]["config"]["vocab_size"] == toks["gpt2_word"].vocab_size
    assert expected["gpt2_word"]["generation_config"]["pad_token_id"] == 0  # "<pad>" is a word


# ---- round trips through our own loader ----------------------------------------------------

def perturbed(model: GPT, seed: int = 0) -> GPT:
    """Every tensor moved away from its initial value (unit norms and zero biases would hide a
    tensor the export drops or misplaces)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def family_model(family: str, tok, extra_rows: int = 0) -> GPT:
    """A random model of `family`'s layout, configured as GPT.from_pretrained configures one."""
    parts = dict(llama=dict(tie_embeddings=False, rope_theta=500000.0, rope_scaling=dict(
                     factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=32.0)),
                 qwen2=dict(qkv_bias=True, rope_theta=1e6), qwen3=dict(qk_norm=True, head_dim=16, rope_theta=1e6))
    return perturbed(GPT(GPTConfig(
        vocab_size=tok.vocab_size, embedding_rows=tok.n_tokens + extra_rows, block_size=64, n_layer=2,
        n_head=4, n_kv_head=2, n_embd=16, bias=False, rms_norm_eps=1e-6, mlp_hidden=24, **parts[family])))


def round_trip(model, tok, tmp_path, **options):
    """Export, then our loader on the folder: (the model read back, its tokenizer, config.json)."""
    export(model, tok, str(tmp_path / "hf"), **options)
    back = GPT.from_pretrained(str(tmp_path / "hf"), vocab_size=tok.vocab_size)
    back_tok = BPETokenizer.from_pretrained(str(tmp_path / "hf")) if tok.state_dict()["type"] == "bpe" else None
    return back, back_tok, json.loads((tmp_path / "hf" / "config.json").read_text())


def assert_same_logits_of_every_token(model, back, tok):
    ids = torch.randint(0, tok.n_tokens, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row too
    with torch.no_grad():
        assert torch.equal(model(ids, mask)[..., :tok.n_tokens], back(ids, mask)[..., :tok.n_tokens])


@pytest.mark.parametrize("family,tokenizer,extra_rows", [
    ("llama", "llama3", 0), ("llama", "smollm2", 0), ("qwen2", "qwen2.5", 40), ("qwen3", "qwen3", 40)])
def test_a_family_round_trips_exactly(family, tokenizer, extra_rows, tmp_path):
    """Our model of each family, exported and read back by GPT.from_pretrained: the same
    configuration, the same tokenizer, bit-identical logits for every token; the rows
    written are the tokenizer's ids, or the embedding's rows where it has more (PAD's row
    kept), the output layer tied or not as it was."""
    tok = BPETokenizer.from_pretrained(str(FIXTURES / "tokenizers" / tokenizer))
    model = family_model(family, tok, extra_rows)
    back, back_tok, hparams = round_trip(model, tok, tmp_path)
    assert asdict(back.config) == asdict(model.config) and same_tokenizer(back_tok, tok)
    assert_same_logits_of_every_token(model, back, tok)
    assert hparams["model_type"] == family and hparams["vocab_size"] == tok.n_tokens + extra_rows
    tensors = read_safetensors(tmp_path / "hf" / "model.safetensors")
    assert len(tensors["model.embed_tokens.weight"]) == hparams["vocab_size"]
    assert ("lm_head.weight" in tensors) == (not model.config.tie_embeddings)
    if extra_rows:  # PAD's row is one of the file's: kept as trained, so every logit is equal
        with torch.no_grad():
            ids = torch.randint(0, tok.n_tokens, (1, 8))
            assert torch.equal(model(ids), back(ids))


def test_gpt2_round_trips_exactly_with_its_own_files_and_without_biases(tmp_path):
    """GPT-2's layout: Conv1D weights transposed back, GPT-2's vocab.json + merges.txt written
    back, PAD's new row dropped (vocab_size = the tokenizer's ids); a model without biases gets
    zero biases, which GPT-2's class needs and which compute the same."""
    from test_bpe import make_files
    tok = BPETokenizer.from_pretrained(str(make_files(tmp_path)))
    for bias in (True, False):
        model = perturbed(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2,
                                        n_embd=16, bias=bias)))
        back, back_tok, hparams = round_trip(model, tok, tmp_path / str(bias))
        assert_same_logits_of_every_token(model, back, tok)
        assert same_tokenizer(back_tok, tok) and hparams["vocab_size"] == tok.n_tokens == tok.pad_id
        assert sorted(os.listdir(tmp_path / str(bias) / "hf")) == [
            "config.json", "generation_config.json", "merges.txt", "model.safetensors", "vocab.json"]
        tensors = read_safetensors(tmp_path / str(bias) / "hf" / "model.safetensors")
        assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)  # (in, out)
        assert bias or not tensors["transformer.h.1.mlp.c_fc.bias"].any()


def test_lora_adapters_are_merged_into_what_is_written(tmp_path):
    """A model holding LoRA adapters is written with them merged: the file a checkpoint's merged
    weights give, logits of the adapted model."""
    tok = BPETokenizer.from_pretrained(str(FIXTURES / "tokenizers" / "qwen3"))
    model = family_model("qwen3", tok, 40)
    add_lora(model, 4, 8.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at zero: make the adapters change the logits
    plain = GPT(model.config)
    plain.load_state_dict(merged_state_dict(model))
    export(model.eval(), tok, str(tmp_path / "a"))
    export(plain.eval(), tok, str(tmp_path / "b"))
    a, b = (read_safetensors(tmp_path / x / "model.safetensors") for x in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    back = GPT.from_pretrained(str(tmp_path / "a"), vocab_size=tok.vocab_size)
    ids = torch.randint(0, tok.n_tokens, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), atol=1e-5, rtol=1e-5)


def test_a_template_kept_in_its_own_file_goes_back_there(tmp_path):
    """A folder whose chat template is chat_template.jinja (not in tokenizer_config.json):
    the export writes it there, and the tokenizer read back is the same."""
    folder = shutil.copytree(FIXTURES / "tokenizers" / "qwen3", tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "chat_template.jinja").write_text(config.pop("chat_template"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = BPETokenizer.from_pretrained(str(folder))
    _, back_tok, _ = round_trip(family_model("qwen3", tok, 40), tok, tmp_path)
    assert (tmp_path / "hf" / "chat_template.jinja").read_text() == (folder / "chat_template.jinja").read_text()
    assert same_tokenizer(back_tok, tok) and back_tok.chat_format == tok.chat_format is not None


def test_bfloat16_weights_and_their_dtype_in_config(tmp_path):
    """--dtype bfloat16 writes every tensor in bf16 and says so in config.json; read back, the
    model is ours with its weights rounded to bf16."""
    tok = BPETokenizer.from_pretrained(str(FIXTURES / "tokenizers" / "llama3"))
    model = family_model("llama", tok)
    back, _, hparams = round_trip(model, tok, tmp_path, dtype="bfloat16")
    assert hparams["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in read_safetensors(tmp_path / "hf" / "model.safetensors").values()} == {torch.bfloat16}
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    assert_same_logits_of_every_token(model, back, tok)


# ---- the command: the word tokenizer, refusals, the atomic write ---------------------------

def word_checkpoint(tmp_path, stage="sft") -> Path:
    tok = WordTokenizer.from_texts(["the plot was good ."])
    model = perturbed(GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=8)))
    path = tmp_path / "run" / "ckpt.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"stage": stage, "model": model.state_dict(), "model_config": asdict(model.config),
                "tokenizer": tok.state_dict(), "step": 3}, path)
    return path.parent


def test_the_word_tokenizers_model_gets_weights_and_config_and_a_line_saying_so(tmp_path, capsys):
    run = word_checkpoint(tmp_path)
    export_main([str(run), str(tmp_path / "hf")])
    out = capsys.readouterr().out
    assert "word tokenizer has no Hugging Face format: wrote the weights and config.json only" in out
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "generation_config.json", "model.safetensors"]
    model, tok, stage = load_policy_checkpoint(str(run))
    back = GPT.from_pretrained(str(tmp_path / "hf"))  # every row is a word: no vocab_size needed
    ids = torch.randint(0, tok.vocab_size, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids), back(ids))
    assert stage == "sft"


def fails(capsys, *argv) -> str:
    """The command with `argv`: exit status 2 and one `error:` line, which is returned."""
    with pytest.raises(SystemExit) as exit_info:
        export_main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


def test_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys):
    run = word_checkpoint(tmp_path)
    assert "no folder or file" in fails(capsys, tmp_path / "nowhere", tmp_path / "a")
    (tmp_path / "empty").mkdir()
    assert "no checkpoint at" in fails(capsys, tmp_path / "empty", tmp_path / "a")
    rm = word_checkpoint(tmp_path / "rm", stage="rm")
    assert "a reward model (train_rm.py), not a policy" in fails(capsys, rm, tmp_path / "a")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert "cannot read checkpoint" in fails(capsys, tmp_path / "notes.txt", tmp_path / "a")
    torch.save({"step": 1}, tmp_path / "other.pt")
    assert "is not a policy checkpoint" in fails(capsys, tmp_path / "other.pt", tmp_path / "a")
    assert "invalid choice" in fails(capsys, run, tmp_path / "a", "--dtype", "int8")
    (tmp_path / "file").write_text("x")
    assert "is a file" in fails(capsys, run, tmp_path / "file")
    assert not (tmp_path / "a").exists()


def test_a_folder_that_is_not_empty_is_replaced_only_when_asked(tmp_path, capsys):
    run = word_checkpoint(tmp_path)
    out = tmp_path / "hf"
    out.mkdir()
    export_main([str(run), str(out)])  # an empty folder is taken
    (out / "mine.txt").write_text("keep me")
    assert "is not empty; pass --overwrite" in fails(capsys, run, out)
    assert (out / "mine.txt").read_text() == "keep me"
    export_main([str(run), str(out), "--overwrite"])
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["hf", "run"]  # no temporary folder left beside it


def test_a_failed_write_leaves_no_folder_and_an_old_one_intact(tmp_path, capsys, monkeypatch):
    """The folder appears only complete: a write that fails part-way (a full disk) leaves
    nothing under the name, nor a temporary folder, and an old folder (--overwrite) as it was."""
    run = word_checkpoint(tmp_path)

    def disk_full(path, *args, **kwargs):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("mingpt_rlhf.machinery.pretrained.write_safetensors", disk_full)
    assert "No space left on device" in fails(capsys, run, tmp_path / "hf")
    assert sorted(os.listdir(tmp_path)) == ["run"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text("{}")
    fails(capsys, run, tmp_path / "old", "--overwrite")
    assert os.listdir(tmp_path / "old") == ["config.json"] and sorted(os.listdir(tmp_path)) == ["old", "run"]


def test_a_model_no_family_computes_is_refused():
    tok = WordTokenizer.from_texts(["a b"])
    both = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8,
                         bias=False, rope_theta=1e4, rms_norm_eps=1e-6, mlp_hidden=8, qkv_bias=True, qk_norm=True))
    with pytest.raises(UserError, match="both q/k/v biases"):
        export_module.hf_folder(both, tok)
    other = WordTokenizer.from_texts(["a b c"])
    with pytest.raises(UserError, match="do not belong together"):
        export_module.hf_folder(both, other)


# ---- the whole way: a family's folder -> SFT on messages -> RM -> GRPO -> export -> reload ----

def family_folder(tmp_path, family: str, tokenizer: str) -> Path:
    """A Hugging Face folder of `family` at tiny size with random weights and a family's
    tokenizer files (tests/fixtures/tokenizers)."""
    from test_family_scripts import BASE, FAMILY, hf_weights
    folder = shutil.copytree(FIXTURES / "tokenizers" / tokenizer, tmp_path / "model",
                             ignore=shutil.ignore_patterns("expected.json"))
    extra = dict(FAMILY[family])
    rows = BPETokenizer.from_pretrained(str(folder)).n_tokens + extra.pop("rows")
    hp = dict(BASE, model_type=family, vocab_size=rows, **extra, max_position_embeddings=256)
    write_safetensors(folder / "model.safetensors", hf_weights(hp, seed=0))
    (folder / "config.json").write_text(json.dumps(hp))
    return folder


@pytest.mark.parametrize("family,tokenizer", [
    ("qwen3", "qwen3"),
    pytest.param("llama", "llama3", marks=pytest.mark.slow),
    pytest.param("qwen2", "qwen2.5", marks=pytest.mark.slow),
    pytest.param("llama", "smollm2", marks=pytest.mark.slow)])
def test_a_familys_folder_through_sft_rm_grpo_and_export(family, tokenizer, tmp_path, capsys):
    """From a tiny random model in a family's folder with its tokenizer: SFT on `messages`
    (the family's chat format), a reward model on message pairs, GRPO on message prompts
    against it, the export of the GRPO policy, and the exported folder read back as
    `--init_from` reads it: the same tokenizer and the GRPO policy's logits for every token."""
    import train_ppo
    import train_rm
    import train_sft
    folder = family_folder(tmp_path, family, tokenizer)
    msgs = lambda *turns: [{"role": r, "content": c} for r, c in turns]
    talk = [(f"what is {a} plus {a}?", f"{2 * a}.") for a in range(6)]
    data = {"demos": [{"messages": msgs(("user", q), ("assistant", r))} for q, r in talk],
            "prefs": [{"messages": msgs(("user", q)), "chosen": r, "rejected": "no"} for q, r in talk],
            "prompts": [{"messages": msgs(("user", q))} for q, _ in talk]}
    for name, rows in data.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = lambda name: str(tmp_path / name)
    sft = train_sft.main(train_sft.Config(out_dir=path("sft"), init_from=str(folder), data=path("demos.jsonl"),
                                          max_iters=2, eval_interval=2, batch_size=4, warmup_iters=1))
    rm = train_rm.main(train_rm.Config(out_dir=path("rm"), sft_dir=path("sft"), data=path("prefs.jsonl"),
                                       batch_size=2, eval_interval=2, norm_samples=2, max_new_tokens=4))
    grpo = train_ppo.main(train_ppo.Config(
        out_dir=path("grpo"), sft_dir=path("sft"), rm_dir=path("rm"), prompts=path("prompts.jsonl"),
        algo="grpo", group_size=2, ptx_coef=0.0, max_iters=1, rollout_batch_size=4, minibatch_size=4,
        ppo_epochs=1, max_new_tokens=4, eval_interval=1, eval_prompts=2))
    assert sft["final"] and 0 <= rm["eval_acc"] <= 1 and grpo["final"]
    capsys.readouterr()
    export_main([path("grpo"), path("grpo_hf")])
    assert "from a GRPO policy" in capsys.readouterr().out
    policy, tok, _ = load_policy_checkpoint(path("grpo"))
    back, back_tok, origin = load_policy("", init_from=path("grpo_hf"))
    assert same_tokenizer(back_tok, tok) and origin == {"init_from": path("grpo_hf")}
    assert asdict(back.config) == asdict(policy.config)
    hparams = json.loads((tmp_path / "grpo_hf" / "config.json").read_text())
    published = json.loads((folder / "config.json").read_text())
    assert hparams["model_type"] == family and hparams["vocab_size"] == published["vocab_size"]
    assert hparams["eos_token_id"] == tok.eos_id  # the chat format's end of turn
    ids = torch.tensor([tok.encode("what is 3 plus 3?")])
    with torch.no_grad():
        assert torch.equal(policy(ids)[..., :tok.n_tokens], back(ids)[..., :tok.n_tokens])
