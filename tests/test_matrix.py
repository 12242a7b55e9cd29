"""Every path a user can take, at tiny size on the CPU: dtype x LoRA x resume, in every script.

A GPU run is bfloat16 by default, often with --lora_rank, usually resumed at least once.
bfloat16 autocast on the CPU runs the same casts, the same frozen bf16 weights (runtime.
hold_frozen_in) and the same LoRA code as on a GPU, so each defect of those paths shows here.

Which combinations, and why (the full product, 7 methods x 2 dtypes x 2 x 2, would take
several minutes of bf16 on a CPU without bf16 instructions; these cover every code path):

    script / method       dtype     LoRA  resumed  also
    train_sft             bfloat16  yes   yes      --grad_accum 2 --grad_checkpoint
    train_rm              bfloat16  yes   yes      --grad_checkpoint
    train_dpo             bfloat16  yes   yes      --grad_accum 2 (the adapters-off reference)
    train_dpo             bfloat16  no    no       (a frozen bf16 copy as reference)
    train_ppo ppo         bfloat16  yes   yes      --critic separate --grad_checkpoint
    train_ppo ppo         bfloat16  no    yes      --critic shared
    train_ppo grpo        bfloat16  yes   no       --kl_in loss
    train_ppo rloo        float32   yes   yes
  float32 full fine-tuning, one process, is tests/test_scripts.py; torchrun is
  tests/test_distributed.py. Then sample.py and the plot reader on every run's output.
  Last, one pass of SFT -> RM -> PPO with GPT-2's 50,257-id vocabulary (tiny width), so the
  chunked output layer, the vocabulary padded to a multiple of 64 and a PAD id of its own run
  as they do with GPT-2.

Every run: it finishes, every logged figure is finite, no optimizer step was skipped; an RL
run starts at KL 0 (step-0 eval and the first rollout; exactly under bf16, where one scoring
pass gives the actor's and the reference's log-probs, to rounding in float32, where the
actor's are the sampler's) and the first minibatch of every update has approx-KL 0 to float32
rounding, |approx-KL| < 1e-6 (the policy that learns is the one that sampled). A resumed
run was killed right after its first checkpoint, with a half-written line left at the end of
metrics.jsonl, and must end where the uninterrupted run ends: the same weights, the same
final figures.
"""
import json
import math
import os

import pytest
import torch

import sample
import train_dpo
import train_ppo
import train_rm
import train_sft
from mingpt_rlhf.run.metrics import read_metrics
from mingpt_rlhf.run.plot import read_run
from test_scripts import TINY, Killed, kill_after_first_save

BF16 = "bfloat16"
FIRST_MINIBATCH_KL = 1e-6  # |approx-KL| of an update's first minibatch: float32 rounding (below)
SMALL_EVAL = dict(eval_prompts=8, max_new_tokens=8)


def sft_cfg(out, **kw):
    return train_sft.Config(**{**dict(out_dir=str(out), **TINY, batch_size=8, max_iters=6,
                                      eval_interval=3, warmup_iters=1, **SMALL_EVAL), **kw})


def rm_cfg(out, sft, **kw):
    return train_rm.Config(**{**dict(out_dir=str(out), sft_dir=str(sft), n_pairs=48, batch_size=8,
                                     eval_interval=3, norm_samples=8, max_new_tokens=8), **kw})


def dpo_cfg(out, sft, **kw):
    return train_dpo.Config(**{**dict(out_dir=str(out), sft_dir=str(sft), n_pairs=48, batch_size=8,
                                      eval_interval=3, warmup_iters=1, **SMALL_EVAL), **kw})


def rl_cfg(out, sft, rm, **kw):
    return train_ppo.Config(**{**dict(out_dir=str(out), sft_dir=str(sft), rm_dir=str(rm),
                                      max_iters=2, eval_interval=1, rollout_batch_size=8,
                                      minibatch_size=4, ppo_epochs=2, **SMALL_EVAL), **kw})


def check_run(out_dir, summary, rl=False):
    """What every run must show: finished, finite figures, no skipped step, KL 0 at start."""
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    assert rows[-1].get("final") and summary["skipped_updates"] == 0
    for row in rows:
        for key, value in row.items():
            assert not isinstance(value, float) or math.isfinite(value), (key, row)
    assert all(row.get("skipped_updates", 0) == 0 for row in rows)
    if rl:
        step0 = [r for r in rows if r.get("split") == "eval" and r["step"] == 0]
        first = [r for r in rows if "pg_loss" in r][0]
        # 0 to float32 rounding: in float32 the actor's log-probs are the sampler's (decoding
        # with the KV cache), the reference's come from a full pass (ppo_trainer.py); under
        # bf16 one scoring pass gives both, and the KL is exactly 0 (logged as 0.0 in every
        # run here, float32 too: metrics.jsonl rounds to 6 decimals)
        assert step0 and abs(step0[0]["kl"]) < 1e-5 and first["step"] == 1 and abs(first["kl"]) < 1e-5
        # two distributions that each sum to 1: some token's ratio is >= 1, a log-ratio >= 0
        assert all(r["max_logratio"] >= -1e-5 for r in rows if "pg_loss" in r)
    read_run(out_dir)  # the plot's reader takes every run


def straight_and_resumed(monkeypatch, module, make_cfg, root):
    """Run `make_cfg(folder)` uninterrupted, and again killed after its first checkpoint with
    a half-written last metrics line, then resumed: the two must end in the same place.
    Returns (summary of the uninterrupted run, summary of the resumed one)."""
    straight = module.main(make_cfg(root / "straight"))
    with monkeypatch.context() as m:
        kill_after_first_save(m, module)
        with pytest.raises(Killed):
            module.main(make_cfg(root / "killed"))
    with open(root / "killed" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "time": 9.1, "lo')  # the process died while appending
    resumed = module.main(make_cfg(root / "killed", resume=True))
    a, b = (torch.load(root / run / "ckpt.pt", weights_only=False) for run in ("straight", "killed"))
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=1e-6, msg=k)
    drop_time = lambda s: {k: v for k, v in s.items() if k != "time"}
    assert drop_time(straight) == drop_time(resumed)
    return straight, resumed


@pytest.fixture(scope="module")
def bf16_stages(tmp_path_factory):
    """SFT (bf16, LoRA, grad_accum 2, checkpointing) and RM (bf16, LoRA), each killed and
    resumed; the later stages of this module start from them."""
    root = tmp_path_factory.mktemp("matrix")
    with pytest.MonkeyPatch.context() as mp:
        lora = dict(dtype=BF16, lora_rank=4, lora_alpha=8.0, grad_checkpoint=True)
        sft, _ = straight_and_resumed(mp, train_sft, lambda out, **kw: sft_cfg(
            out, grad_accum=2, **lora, **kw), root / "sft")
        check_run(root / "sft" / "killed", sft)
        rm, _ = straight_and_resumed(mp, train_rm, lambda out, **kw: rm_cfg(
            out, root / "sft" / "killed", **lora, **kw), root / "rm")
        check_run(root / "rm" / "killed", rm)
    return root / "sft" / "killed", root / "rm" / "killed"


def sample_from(ckpt_dir, rm_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the plot was"}\n{"prompt": "the cast felt"}\n')
    sample.main(sample.Config(ckpt_dir=str(ckpt_dir), prompts=str(prompts), rm_dir=str(rm_dir),
                              max_new_tokens=8))
    out = capsys.readouterr().out
    assert "the plot was" in out and "the cast felt" in out


def test_sft_and_rm_in_bf16_with_lora_resume_exactly(bf16_stages, tmp_path, capsys):
    sft, rm = bf16_stages
    sample_from(sft, rm, tmp_path, capsys)


@pytest.mark.parametrize("lora", [4, 0], ids=["lora", "full"])
def test_dpo_in_bf16(bf16_stages, tmp_path, monkeypatch, capsys, lora):
    """With LoRA the eval's sampling needs autocast (a bf16 base); resumed, the base checksum
    is compared after the base is held in bf16."""
    sft, rm = bf16_stages
    make = lambda out, **kw: dpo_cfg(out, sft, dtype=BF16, lora_rank=lora, lora_alpha=8.0,
                                     grad_accum=2 if lora else 1, **kw)
    if lora:
        summary, _ = straight_and_resumed(monkeypatch, train_dpo, make, tmp_path)
        out = tmp_path / "killed"
    else:
        out = tmp_path / "dpo"
        summary = train_dpo.main(make(out))
    check_run(out, summary)
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    assert [r for r in rows if r.get("split") == "eval"][0]["kl"] == 0.0
    sample_from(out, rm, tmp_path, capsys)


@pytest.mark.parametrize("algo,dtype,lora,resume,extra", [
    ("ppo", BF16, 4, True, dict(critic="separate", grad_checkpoint=True)),
    ("ppo", BF16, 0, True, dict(critic="shared")),
    ("grpo", BF16, 4, False, dict(group_size=4, kl_in="loss")),
    ("rloo", "float32", 4, True, dict(group_size=4)),
    ("online_dpo", BF16, 4, True, dict(sampler_lag=2)),
    ("grpo", BF16, 4, True, dict(group_size=4, cov_loss="kl_cov", learn_tokens="negative")),
    ("rloo", BF16, 0, True, dict(group_size=4, cov_loss="clip_cov", clip_cov_low=0.0)),
], ids=["ppo-separate-bf16-lora-resume", "ppo-shared-bf16-resume", "grpo-bf16-lora",
        "rloo-fp32-lora-resume", "online_dpo-bf16-lora-lag2-resume",
        "grpo-kl_cov-negative-bf16-lora-resume", "rloo-clip_cov-bf16-resume"])
def test_rl_methods(bf16_stages, tmp_path, monkeypatch, capsys, first_minibatch_kl, algo, dtype,
                    lora, resume, extra):
    sft, rm = bf16_stages
    make = lambda out, **kw: rl_cfg(out, sft, rm, algo=algo, dtype=dtype, lora_rank=lora,
                                    lora_alpha=8.0, **extra, **kw)
    if resume:
        summary, _ = straight_and_resumed(monkeypatch, train_ppo, make, tmp_path)
        out = tmp_path / "killed"
        check_run(tmp_path / "straight", summary, rl=True)
    else:
        out = tmp_path / "run"
        summary = train_ppo.main(make(out))
    check_run(out, summary, rl=True)
    assert first_minibatch_kl and max(map(abs, first_minibatch_kl)) < FIRST_MINIBATCH_KL, \
        first_minibatch_kl
    sample_from(out, rm, tmp_path, capsys)


def gpt2_vocab_folder(folder):
    """GPT-2's files at tiny width: vocab.json with 50,257 ids (the BPE test's merges, then
    filler tokens, <|endoftext|> last at 50256), merges.txt, random weights."""
    from test_bpe import make_files
    from test_pretrained import gpt2_raw, write_safetensors
    make_files(folder)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    eot = max(vocab, key=vocab.get)
    del vocab[eot]
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), 50256)})
    vocab[eot] = 50256
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    raw = gpt2_raw(vocab=50257)
    raw["wpe.weight"] = torch.randn(64, raw["wpe.weight"].size(1)) * 0.02  # block 64
    write_safetensors(folder / "model.safetensors", raw)
    (folder / "config.json").write_text(json.dumps({"n_head": 4}))
    return folder


def gpt2_vocab_pipeline(root, first_minibatch_kl, **where):
    """SFT (LoRA) -> RM -> PPO (LoRA, ptx) on user JSONL from the 50,257-id GPT-2 files, in
    bf16 unless `where` says otherwise (device, dtype). Returns the three out_dirs."""
    from mingpt_rlhf.tokenizer import tokenizer_from_state
    from test_gpt2_scripts import DIALOGUES, write_jsonl
    where = {"dtype": BF16, **where}
    folder = gpt2_vocab_folder(root)
    demos = write_jsonl(root / "demos.jsonl",
                        [{"prompt": p, "response": r} for p, r in DIALOGUES] * 8)
    prefs = write_jsonl(root / "prefs.jsonl",
                        [{"prompt": p, "chosen": r, "rejected": " no."} for p, r in DIALOGUES] * 8)
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": p} for p, _ in DIALOGUES] * 3)
    sft = train_sft.main(train_sft.Config(out_dir=str(root / "sft"), init_from=str(folder),
                                          data=demos, max_iters=3, eval_interval=3, batch_size=8,
                                          warmup_iters=1, lora_rank=4, **where))
    check_run(root / "sft", sft)
    ckpt = torch.load(root / "sft" / "ckpt.pt", weights_only=False)
    tok = tokenizer_from_state(ckpt["tokenizer"])
    assert tok.eos_id == 50256 and tok.pad_id == 50257 and tok.vocab_size == 50258
    assert ckpt["model"]["transformer.wte.weight"].shape[0] == 50304  # padded to 64
    rm = train_rm.main(train_rm.Config(out_dir=str(root / "rm"), sft_dir=str(root / "sft"),
                                       data=prefs, batch_size=4, eval_interval=4, norm_samples=4,
                                       max_new_tokens=8, **where))
    check_run(root / "rm", rm)
    ppo = train_ppo.main(train_ppo.Config(
        out_dir=str(root / "ppo"), sft_dir=str(root / "sft"), rm_dir=str(root / "rm"),
        prompts=prompts, ptx_data=demos, max_iters=2, rollout_batch_size=4, minibatch_size=2,
        ppo_epochs=1, max_new_tokens=8, eval_interval=2, eval_prompts=4, lora_rank=4, **where))
    check_run(root / "ppo", ppo, rl=True)
    # float32 rounding on the CPU; on a GPU (tests/test_gpu.py), whose kernels pick their
    # blocking by shape, bf16 passes of other shapes round further apart: 1e-3 there
    bound = FIRST_MINIBATCH_KL if where.get("device", "cpu") == "cpu" else 1e-3
    assert first_minibatch_kl and max(map(abs, first_minibatch_kl)) < bound, first_minibatch_kl
    return root / "sft", root / "rm", root / "ppo"


def test_gpt2_vocabulary_through_sft_rm_and_ppo(tmp_path, first_minibatch_kl):
    gpt2_vocab_pipeline(tmp_path, first_minibatch_kl)
