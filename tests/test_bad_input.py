"""Every mistake a careless user can type, for every script: exit status 2, one line that
names the problem (and the fix), never a traceback.

The table runs each script's entry point in this process (`cli.run`, what `python X.py` calls),
so a case is cheap; anything but a one-line `error:` and status 2 fails the test, and an
unexpected exception fails it with its traceback. `test_scripts.py` runs each script once as
a real program (`python X.py`, a subprocess) with a mistake of this kind.
"""
import errno
import json
import os
import shutil

import pytest
import torch

import train_sft
from conftest import exits_2
from mingpt_rlhf.machinery import checkpoint, cli, runtime
from test_scripts import sft_cfg

# options that keep a run tiny, so a case that wrongly passes validation still ends quickly
SMALL = {
    "train_sft": ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "48",
                  "--max_iters", "2", "--eval_interval", "1", "--eval_prompts", "4", "--batch_size", "4"],
    "train_rm": ["--n_pairs", "32", "--batch_size", "8", "--norm_samples", "8"],
    "train_ppo": ["--max_iters", "1", "--rollout_batch_size", "8", "--minibatch_size", "4",
                  "--eval_prompts", "4", "--max_new_tokens", "8"],
    "train_dpo": ["--n_pairs", "32", "--batch_size", "8", "--eval_prompts", "4", "--max_new_tokens", "8"],
    "sample": ["--max_new_tokens", "4"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, stages):
    """The shared tiny SFT and RM runs (copied), an SFT run with another tokenizer, and the
    broken files of the table."""
    root = tmp_path_factory.mktemp("bad_input")
    for name in ("sft", "rm"):
        shutil.copytree(stages[0] / name, root / name)
    demos = root / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": f"w{i} x", "response": f"y{i} z"}) + "\n"
                             for i in range(40)))
    train_sft.main(sft_cfg(root / "other_sft", data=str(demos), max_iters=2, eval_interval=2))
    files = {
        "prompts": json.dumps({"prompt": "the plot was"}) + "\n",
        "empty": "",
        "blank": "\n\n",
        "latin1": None,  # written as bytes below
        "not_json": "this is not json\n",
        "json_list": "[1, 2]\n",
        "sft_no_response": json.dumps({"prompt": "the plot was"}) + "\n",
        "sft_number": json.dumps({"prompt": "the plot was", "response": 3}) + "\n",
        "pref_no_rejected": json.dumps({"prompt": "a", "chosen": "b"}) + "\n",
        "prompt_number": json.dumps({"prompt": 7}) + "\n",
        "prompt_missing": json.dumps({"text": "the plot was"}) + "\n",
        "msg_role": json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n",
        "msg_no_answer": json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n",
        "msg_pair_answered": json.dumps({"messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b"}],
                                         "chosen": "c", "rejected": "d"}) + "\n",
    }
    for name, text in files.items():
        path = root / f"{name}.jsonl"
        if text is None:
            path.write_bytes(json.dumps({"prompt": "caf\u00e9", "response": "ok"}, ensure_ascii=False).encode("latin-1") + b"\n")
        else:
            path.write_text(text)
    (root / "a_file").write_text("not a folder\n")
    (root / "garbage").mkdir()
    (root / "garbage" / "ckpt.pt").write_bytes(b"\x00not a torch file")
    (root / "empty_dir").mkdir()
    # a SentencePiece model's tokenizer.json: no ByteLevel step, so not read
    spiece = shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "tokenizers", "qwen3"),
                             root / "sentencepiece")
    spec = json.loads((spiece / "tokenizer.json").read_text(encoding="utf-8"))
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}
    (spiece / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return root


def W(path):  # a path in the test's world, filled in per case
    return ("world", path)


# (script, argv, words the one line must contain); W(...) paths are under the `world` fixture
CASES = [
    # ---- option values: wrong types, impossible numbers, unknown names
    ("train_sft", ["--lr", "fast"], ["--lr"]),
    ("train_sft", ["--batch_size", "2.5"], ["--batch_size"]),
    ("train_sft", ["--resume", "maybe"], ["--resume"]),
    ("train_sft", ["--batch_size", "0"], ["--batch_size"]),
    ("train_sft", ["--dropout", "1.5"], ["--dropout"]),
    ("train_sft", ["--n_embd", "30", "--n_head", "4"], ["--n_embd"]),
    ("train_sft", ["--dtype", "float8"], ["--dtype"]),
    ("train_sft", ["--device", "tpu"], ["--device"]),
    ("train_sft", ["--device", "cuda"], ["cuda"]),  # on a machine without CUDA (see the test)
    ("train_sft", ["--task", "poems"], ["poems"]),
    ("train_sft", ["--eval_prompts", "-1"], ["--eval_prompts"]),
    ("train_sft", ["--warmup_iters", "-5"], ["--warmup_iters"]),
    ("train_sft", ["--grad_clip", "-1"], ["--grad_clip"]),
    ("train_sft", ["--lr", "-0.001"], ["--lr"]),
    ("train_sft", ["--lora_rank", "-2"], ["--lora_rank"]),
    ("train_sft", ["--lora_rank", "4", "--lora_targets", "c_nothing"], ["c_nothing"]),
    ("train_sft", ["--init_from", "gpt-17"], ["gpt-17"]),
    ("train_sft", ["--init_from", W("empty_dir")], ["empty_dir"]),
    ("train_sft", ["--max_new_tokens", "48"], ["--max_new_tokens"]),
    ("train_sft", ["--seed", "-1"], ["--seed"]),
    ("train_rm", ["--max_new_tokens", "500"], ["--max_new_tokens"]),
    ("train_rm", ["--epochs", "0"], ["--epochs"]),
    ("train_rm", ["--n_pairs", "0"], ["--n_pairs"]),
    ("train_ppo", ["--minibatch_size", "0"], ["--minibatch_size"]),
    ("train_ppo", ["--minibatch_size", "16"], ["--minibatch_size"]),
    ("train_ppo", ["--eval_prompts", "0"], ["--eval_prompts"]),
    ("train_ppo", ["--top_p", "0"], ["--top_p"]),
    ("train_ppo", ["--temperature", "0"], ["--temperature"]),
    ("train_ppo", ["--kl_coef", "-0.5"], ["--kl_coef"]),
    ("train_ppo", ["--max_new_tokens", "500"], ["--max_new_tokens"]),
    ("train_dpo", ["--beta", "-1"], ["--beta"]),
    ("train_dpo", ["--loss", "kto"], ["--loss"]),
    ("train_dpo", ["--max_new_tokens", "500"], ["--max_new_tokens"]),
    ("train_ppo", ["--seed", "5000000000"], ["--seed"]),
    ("sample", ["--temperature", "0"], ["--temperature"]),
    ("sample", ["--num_samples", "0"], ["--num_samples"]),
    ("sample", ["--top_p", "2"], ["--top_p"]),
    ("sample", ["--max_new_tokens", "500"], ["--max_new_tokens"]),
    ("sample", ["--prompt", "a", "--prompts", W("not_json.jsonl")], ["--prompt"]),
    # ---- data files: missing, empty, not UTF-8, not JSON, wrong fields, wrong types
    ("train_sft", ["--data", W("nowhere.jsonl")], ["nowhere.jsonl"]),
    ("train_sft", ["--data", W("empty.jsonl")], ["empty.jsonl"]),
    ("train_sft", ["--data", W("blank.jsonl")], ["blank.jsonl"]),
    ("train_sft", ["--data", W("latin1.jsonl")], ["UTF-8"]),
    ("train_sft", ["--data", W("not_json.jsonl")], ["not_json.jsonl:1"]),
    ("train_sft", ["--data", W("json_list.jsonl")], ["json_list.jsonl:1"]),
    ("train_sft", ["--data", W("sft_no_response.jsonl")], ["response"]),
    ("train_sft", ["--data", W("sft_number.jsonl")], ["response"]),
    ("train_sft", ["--data", W("garbage")], ["garbage"]),  # a folder, not a file
    ("train_sft", ["--data", W("msg_role.jsonl")], ["msg_role.jsonl:1", "'bot'"]),
    ("train_sft", ["--data", W("msg_no_answer.jsonl")], ["msg_no_answer.jsonl:1", "no assistant"]),
    ("train_rm", ["--data", W("msg_pair_answered.jsonl")], ["ends with an assistant message"]),
    ("train_ppo", ["--prompts", W("msg_role.jsonl"), "--ptx_coef", "0"], ["'bot'"]),
    ("train_sft", ["--init_from", W("sentencepiece")], ["sentencepiece", "ByteLevel"]),
    ("train_sft", ["--data", W("demos.jsonl"), "--eval_data", W("empty.jsonl")], ["empty.jsonl"]),
    ("train_rm", ["--data", W("latin1.jsonl")], ["UTF-8"]),
    ("train_rm", ["--data", W("empty.jsonl")], ["empty.jsonl"]),
    ("train_rm", ["--data", W("pref_no_rejected.jsonl")], ["rejected"]),
    ("train_ppo", ["--prompts", W("latin1.jsonl"), "--ptx_coef", "0"], ["UTF-8"]),
    ("train_ppo", ["--prompts", W("empty.jsonl"), "--ptx_coef", "0"], ["empty.jsonl"]),
    ("train_ppo", ["--prompts", W("prompt_number.jsonl"), "--ptx_coef", "0"], ["prompt"]),
    ("train_ppo", ["--prompts", W("prompt_missing.jsonl"), "--ptx_coef", "0"], ["prompt"]),
    ("train_ppo", ["--prompts", W("prompts.jsonl")], ["--ptx_data"]),  # ptx needs demonstrations
    ("train_ppo", ["--prompts", W("prompts.jsonl"), "--eval_prompts_file", W("latin1.jsonl"),
                   "--ptx_coef", "0"], ["UTF-8"]),
    ("train_ppo", ["--eval_prompts_file", W("prompts.jsonl")], ["--prompts"]),
    ("train_sft", ["--eval_data", W("demos.jsonl")], ["--data"]),
    ("train_rm", ["--eval_data", W("demos.jsonl")], ["--data"]),
    ("train_dpo", ["--eval_data", W("demos.jsonl")], ["--data"]),
    ("train_dpo", ["--data", W("latin1.jsonl")], ["UTF-8"]),
    ("train_dpo", ["--data", W("pref_no_rejected.jsonl")], ["rejected"]),
    ("sample", ["--prompts", W("latin1.jsonl")], ["UTF-8"]),
    ("sample", ["--prompts", W("empty.jsonl")], ["empty.jsonl"]),
    ("sample", ["--prompts", W("prompt_number.jsonl")], ["prompt"]),
    # ---- checkpoints: missing, not a checkpoint, the wrong kind, another tokenizer
    ("train_rm", ["--sft_dir", W("nowhere")], ["nowhere"]),
    ("train_rm", ["--sft_dir", W("garbage")], ["garbage"]),
    ("train_rm", ["--sft_dir", W("rm")], ["reward model"]),
    ("train_ppo", ["--sft_dir", W("rm")], ["reward model"]),
    ("train_ppo", ["--rm_dir", W("sft")], ["not a reward model"]),
    ("train_ppo", ["--rm_dir", W("garbage")], ["garbage"]),
    ("train_ppo", ["--sft_dir", W("other_sft")], ["tokenizer"]),
    ("train_dpo", ["--sft_dir", W("rm")], ["reward model"]),
    ("train_dpo", ["--rm_dir", W("sft")], ["not a reward model"]),
    ("train_dpo", ["--sft_dir", W("other_sft"), "--rm_dir", W("rm")], ["tokenizer"]),
    ("sample", ["--ckpt_dir", W("rm")], ["reward model"]),
    ("sample", ["--ckpt_dir", W("garbage")], ["garbage"]),
    ("sample", ["--compare", W("other_sft")], ["tokenizer"]),
    ("sample", ["--rm_dir", W("sft")], ["not a reward model"]),
    ("sample", ["--ckpt_dir", W("other_sft"), "--rm_dir", W("rm")], ["tokenizer"]),
    # ---- out_dir: a file, inside a file, resume from nothing or from another stage
    ("train_sft", ["--out_dir", W("a_file")], ["a_file"]),
    ("train_sft", ["--out_dir", W("a_file/run")], ["a_file"]),
    ("train_sft", ["--out_dir", W("empty_dir"), "--resume"], ["--resume"]),
    ("train_sft", ["--out_dir", W("garbage"), "--resume"], ["garbage"]),
    ("train_sft", ["--out_dir", W("rm"), "--resume"], ["reward model"]),
    ("train_rm", ["--out_dir", W("a_file")], ["a_file"]),
    ("train_ppo", ["--out_dir", W("a_file")], ["a_file"]),
    ("train_dpo", ["--out_dir", W("a_file")], ["a_file"]),
]

# which checkpoints each script reads unless the case names its own
DEFAULT_DIRS = {"train_rm": {"--sft_dir": "sft", "--out_dir": "new_run"},
                "train_ppo": {"--sft_dir": "sft", "--rm_dir": "rm", "--out_dir": "new_run"},
                "train_dpo": {"--sft_dir": "sft", "--out_dir": "new_run"},
                "train_sft": {"--out_dir": "new_run"},
                "sample": {"--ckpt_dir": "sft", "--prompt": "the plot was"}}


def command_line(world, tmp_path, script, argv):
    argv = [str(world / a[1]) if isinstance(a, tuple) else a for a in argv]
    defaults = []
    for flag, folder in DEFAULT_DIRS[script].items():
        if flag in argv or (flag == "--prompt" and "--prompts" in argv):
            continue
        value = str(tmp_path / folder) if folder == "new_run" else \
            folder if flag == "--prompt" else str(world / folder)
        defaults += [flag, value]
    return SMALL[script] + defaults + argv


@pytest.mark.parametrize("script,argv,words", CASES,
                         ids=[f"{s}:{' '.join(a if isinstance(a, str) else a[1] for a in v)}"
                              for s, v, _ in CASES])
def test_a_user_mistake_exits_2_with_one_line(world, tmp_path, capsys, monkeypatch, script, argv,
                                              words):
    # the table is what a machine without a CUDA GPU answers (`--device cuda` is a mistake
    # there, and `--device auto` means the CPU); on a GPU machine too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = exits_2(capsys, script, command_line(world, tmp_path, script, argv))
    for word in words:
        assert word in line, line


# ---- the file system fails under a run: read-only out_dir, disk full while saving


def failing(error_number):
    def fail(*args, **kwargs):
        raise OSError(error_number, os.strerror(error_number))
    return fail


def test_an_out_dir_that_cannot_be_written_is_refused_before_training(world, tmp_path, capsys, monkeypatch):
    # we run as root here, where chmod does not stop writes: the OS's answer is simulated
    monkeypatch.setattr(runtime, "open", failing(errno.EROFS), raising=False)
    line = exits_2(capsys, "train_sft", command_line(world, tmp_path, "train_sft", []))
    assert "new_run" in line and os.strerror(errno.EROFS) in line and "--out_dir" in line


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_a_read_only_out_dir_is_refused(world, tmp_path, capsys):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    line = exits_2(capsys, "train_sft", command_line(world, tmp_path, "train_sft",
                                                      ["--out_dir", str(tmp_path / "ro")]))
    assert "ro" in line and "--out_dir" in line


def test_a_full_disk_while_saving_keeps_the_last_checkpoint(world, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    argv = command_line(world, tmp_path, "train_sft", ["--out_dir", str(run), "--max_iters", "2"])
    cli.run(train_sft.main, train_sft.Config, argv)
    capsys.readouterr()
    before = (run / "ckpt.pt").read_bytes()
    real_save = torch.save

    def save_half_then_fail(obj, f, *a, **k):  # a few bytes reach the disk, then ENOSPC
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(torch, "save", save_half_then_fail)
    line = exits_2(capsys, "train_sft", argv)
    monkeypatch.setattr(torch, "save", real_save)
    assert os.strerror(errno.ENOSPC) in line and "ckpt.pt" in line
    assert (run / "ckpt.pt").read_bytes() == before  # the previous checkpoint is intact
    assert sorted(os.listdir(run)) == sorted(["ckpt.pt", "metrics.jsonl", *(
        ["curves.png"] if (run / "curves.png").exists() else [])])  # no temporary file left


def test_save_checkpoint_turns_a_full_disk_into_a_user_error(tmp_path, monkeypatch):
    from mingpt_rlhf.machinery.errors import UserError
    monkeypatch.setattr(torch, "save", failing(errno.ENOSPC))
    with pytest.raises(UserError, match="No space left"):
        checkpoint.save_checkpoint(str(tmp_path / "ckpt.pt"), {"x": 1})
    assert os.listdir(tmp_path) == []


def test_metrics_that_cannot_be_appended_are_a_user_error(tmp_path, monkeypatch):
    from mingpt_rlhf.machinery.errors import UserError
    from mingpt_rlhf.run import metrics
    log = metrics.MetricsLog(str(tmp_path))
    monkeypatch.setattr(metrics, "open", failing(errno.ENOSPC), raising=False)
    with pytest.raises(UserError, match="metrics.jsonl"):
        log.log(1, loss=1.0)


@pytest.mark.parametrize("argv,words", [
    ([], ["runs"]),
    ([W("sft"), "--out", W("nowhere/curves.png")], ["nowhere"]),
    ([W("empty_dir")], ["metrics"]),
    ([W("sft"), "--colour", "red"], ["--colour"]),
])
def test_plot_mistakes_exit_2_with_one_line(world, capsys, argv, words):
    pytest.importorskip("matplotlib")
    from mingpt_rlhf.run import plot
    with pytest.raises(SystemExit) as exit_info:
        plot.main([str(world / a[1]) if isinstance(a, tuple) else a for a in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error:"), err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("argv,words", [
    ([], ["runs"]),
    ([W("empty_dir")], ["metrics"]),
    ([W("sft")], ["RL runs"]),
    ([W("sft"), "--colour", "red"], ["--colour"]),
])
def test_report_mistakes_exit_2_with_one_line(world, capsys, argv, words):
    from mingpt_rlhf.run import report
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(world / a[1]) if isinstance(a, tuple) else a for a in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error:"), err
    for word in words:
        assert word in err, err


def test_rollouts_that_cannot_be_appended_are_a_user_error(tmp_path, monkeypatch):
    from mingpt_rlhf.run import rollouts
    from mingpt_rlhf.machinery.errors import UserError
    from test_report import TOKENIZER
    from test_wiring import build_trainer, ppo_config, random_prompts
    trainer = build_trainer(ppo_config(algo="ppo"))
    exp, _ = trainer.make_experience(*random_prompts(2), for_update=False)
    recorder = rollouts.RolloutRecorder(str(tmp_path), 2, TOKENIZER)
    monkeypatch.setattr(rollouts, "open", failing(errno.ENOSPC), raising=False)
    with pytest.raises(UserError, match="rollouts.jsonl"):
        recorder.record(trainer, 0, exp)
