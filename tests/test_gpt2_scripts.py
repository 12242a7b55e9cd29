"""All three scripts from a tiny "pretrained" GPT-2 written by the test (safetensors + BPE
files), on JSONL data in the formats users bring: demonstrations, raw HH preference pairs,
prompts. No network."""
import json

import pytest
import torch

import train_ppo
import train_rm
import train_sft
from mingpt_rlhf.tokenizer import tokenizer_from_state
from test_bpe import make_files
from test_pretrained import gpt2_raw, write_safetensors

DIALOGUES = [("Human: say hello\n\nAssistant:", " hello there"),
             ("Human: what is 2+2?\n\nAssistant:", " it is 4"),
             ("Human: name a colour\n\nAssistant:", " blue, I'd say")]


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = make_files(tmp_path_factory.mktemp("gpt2"))
    vocab = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    raw = gpt2_raw(vocab=vocab)
    raw["wpe.weight"] = torch.randn(64, raw["wpe.weight"].size(1)) * 0.02  # block 64
    write_safetensors(folder / "model.safetensors", raw)
    (folder / "config.json").write_text(json.dumps({"n_head": 4}))
    return folder


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_three_stages_from_a_gpt2_checkpoint(gpt2_folder, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl",
                        [{"prompt": p, "response": r} for p, r in DIALOGUES] * 8)
    prefs = write_jsonl(tmp_path / "hh.jsonl",  # raw Anthropic HH: the dialogue is in both sides
                        [{"chosen": p + r, "rejected": p + " no."} for p, r in DIALOGUES] * 8)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p, _ in DIALOGUES] * 3)

    sft = train_sft.main(train_sft.Config(
        out_dir=str(tmp_path / "sft"), init_from=str(gpt2_folder), data=demos, max_iters=4,
        eval_interval=2, batch_size=4, warmup_iters=1))
    assert sft["final"] and "eval_loss" in sft and "gold" not in sft  # no gold for user data
    ckpt = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=False)
    tok = tokenizer_from_state(ckpt["tokenizer"])
    assert ckpt["tokenizer"]["type"] == "bpe" and tok.pad_id != tok.eos_id
    assert ckpt["model_config"]["vocab_size"] == tok.vocab_size  # room for the PAD id

    rm = train_rm.main(train_rm.Config(
        out_dir=str(tmp_path / "rm"), sft_dir=str(tmp_path / "sft"), data=prefs, batch_size=4,
        eval_interval=2, norm_samples=4, max_new_tokens=8))
    assert 0 <= rm["eval_acc"] <= 1 and "eval_gold_acc" not in rm

    ppo = train_ppo.main(train_ppo.Config(
        out_dir=str(tmp_path / "ppo"), sft_dir=str(tmp_path / "sft"), rm_dir=str(tmp_path / "rm"),
        prompts=prompts, ptx_data=demos, max_iters=2, rollout_batch_size=4, minibatch_size=2,
        ppo_epochs=1, max_new_tokens=8, eval_interval=1, eval_prompts=4))
    assert ppo["final"] and {"rm_score", "kl", "distinct2"} <= set(ppo)


def test_reward_model_straight_from_gpt2(gpt2_folder, tmp_path):
    prefs = write_jsonl(tmp_path / "prefs.jsonl",
                        [{"prompt": p, "chosen": r, "rejected": " no."} for p, r in DIALOGUES] * 8)
    train_rm.main(train_rm.Config(out_dir=str(tmp_path / "rm"), init_from=str(gpt2_folder),
                                       data=prefs, batch_size=4, eval_interval=2, norm_samples=4,
                                       max_new_tokens=8))
    ckpt = torch.load(tmp_path / "rm" / "ckpt.pt", weights_only=False)
    assert ckpt["sft"] == {"init_from": str(gpt2_folder)} and ckpt["stage"] == "rm"


def test_long_prompts_are_cut_from_the_left(gpt2_folder):
    from mingpt_rlhf.data import encode_example
    tok = tokenizer_from_state(json.loads(json.dumps({"type": "bpe", **_state(gpt2_folder)})))
    ids, n_prompt = encode_example(tok, "the " * 100 + "end", " ok", block_size=16)
    assert len(ids) == 16 and ids[-1] == tok.eos_id
    assert tok.decode(ids[:n_prompt]).endswith("end")  # the end of the prompt survives


def _state(folder):
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    st = BPETokenizer.from_pretrained(str(folder)).state_dict()
    st.pop("type")
    return st


def test_episodes_with_gpt2s_tokenizer(gpt2_folder, tmp_path, first_minibatch_kl):
    """The guessing game with GPT-2's byte-level BPE: SFT on the teacher's episodes (each turn
    encoded on its own), GRPO on episodes (the 64-position context ends some of them), the
    stored log-probs the learner's (first minibatch approx-KL 0), and sample.py's dialogues."""
    import sample
    sft = train_sft.main(train_sft.Config(
        out_dir=str(tmp_path / "sft"), init_from=str(gpt2_folder), env="guess", max_iters=4,
        eval_interval=2, batch_size=4, warmup_iters=1, max_new_tokens=3, eval_prompts=4))
    assert {"turns", "success", "reward"} <= set(sft)
    grpo = train_ppo.main(train_ppo.Config(
        out_dir=str(tmp_path / "grpo"), sft_dir=str(tmp_path / "sft"), env="guess", algo="grpo",
        group_size=2, max_iters=2, rollout_batch_size=4, minibatch_size=2, ppo_epochs=1,
        max_new_tokens=3, eval_interval=1, eval_prompts=4))
    assert grpo["final"] and 1 <= grpo["turns"] <= 6
    assert max(abs(k) for k in first_minibatch_kl) < 1e-6
    rows = sample.main(sample.Config(ckpt_dir=str(tmp_path / "grpo"), env="guess",
                                     num_samples=2, max_new_tokens=3))
    assert rows[0]["transcript"][0] == ("env", "guess a number from 1 to 15 :")
