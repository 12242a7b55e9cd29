"""Guards against silent nonsense: a task the policy has no words for, an empty prompt, an
eval split that moves with the seed, a LoRA checkpoint merged into a rounded base."""
import json
from dataclasses import asdict

import pytest
import torch

import train_dpo
import train_ppo
import train_rm
import train_sft
from mingpt_rlhf.machinery.checkpoint import save_checkpoint
from mingpt_rlhf.machinery.cli import run
from mingpt_rlhf.data import PairData, encode_prompt
from mingpt_rlhf.methods.dpo import response_logprob_sums
from mingpt_rlhf.machinery.errors import UserError
from mingpt_rlhf.model import GPT, GPTConfig
from mingpt_rlhf.tasks import get_task
from mingpt_rlhf.task_base import PreferencePair
from mingpt_rlhf.tokenizer import WordTokenizer
from mingpt_rlhf.run.watch import idle_update_warning
from test_scripts import TINY, ppo_cfg, read_metrics, rm_cfg


def random_policy(folder, task_name):
    """An untrained SFT checkpoint with `task_name`'s vocabulary: as a trained one to the
    checks, in no time. Returns the folder."""
    tokenizer = get_task(task_name).tokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **TINY))
    save_checkpoint(str(folder / "ckpt.pt"), {
        "stage": "sft", "model": model.state_dict(), "model_config": asdict(model.config),
        "tokenizer": tokenizer.state_dict(), "step": 0})
    return folder


def grpo_on_task(out_dir, sft_dir, task, **kw):
    """The quickest RL run on a built-in task: GRPO against the task's check, no RM."""
    return ppo_cfg(out_dir, sft_dir, out_dir / "no_rm", **{
        **dict(task=task, reward="task", algo="grpo", max_iters=1, eval_interval=1), **kw})


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------- a task in another vocabulary
def test_ppo_on_sort_from_a_reviews_policy_is_refused_in_one_line(stages, tmp_path, capsys):
    root, _, _ = stages
    argv = ["--task", "sort", "--reward", "task", "--sft_dir", str(root / "sft"),
            "--out_dir", str(tmp_path / "ppo")]
    with pytest.raises(SystemExit) as e:
        run(train_ppo.main, train_ppo.Config, argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--task sort" in err and str(root / "sft") in err and "other words" in err
    assert "train_sft.py --task sort" in err and "--sft_dir" in err


def test_rm_and_dpo_on_sort_from_a_reviews_policy_are_refused(stages, tmp_path):
    root, _, _ = stages
    with pytest.raises(UserError, match="--task sort has words that the tokenizer of the policy in .*sft"):
        train_rm.main(rm_cfg(tmp_path / "rm", root / "sft", task="sort"))
    with pytest.raises(UserError, match="--task sort has words that the tokenizer of the policy in .*sft"):
        train_dpo.main(train_dpo.Config(out_dir=str(tmp_path / "dpo"), sft_dir=str(root / "sft"),
                                        task="sort"))


def test_reviews_from_a_sort_policy_is_refused(tmp_path):
    sort_sft = random_policy(tmp_path / "sort_sft", "sort")
    with pytest.raises(UserError, match="--task reviews .*trained on other words"):
        train_ppo.main(grpo_on_task(tmp_path / "ppo", sort_sft, "reviews"))


def test_sft_resumed_with_another_task_is_refused(tmp_path):
    random_policy(tmp_path / "sft", "sort")  # what a sort SFT run killed early leaves
    with pytest.raises(UserError, match="resume with the --task it started with"):
        train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft"), task="reviews",
                                        resume=True, **TINY))


def test_vocabularies_that_read_the_task_pass(tmp_path):
    """GPT-2's BPE encodes any text; a word vocabulary holding every word of the task does too
    (a file's words plus some); each task passes with its own."""
    from mingpt_rlhf.machinery.bpe import BPETokenizer
    from mingpt_rlhf.tasks import VOCAB
    from test_bpe import make_files
    reviews = get_task("reviews")
    reviews.check_vocabulary(BPETokenizer.from_pretrained(str(make_files(tmp_path))), "gpt2")
    reviews.check_vocabulary(WordTokenizer(["popcorn"] + VOCAB[::-1]), "mine")
    for name in ("reviews", "sort"):
        get_task(name).check_vocabulary(get_task(name).tokenizer(), "its own")
    with pytest.raises(UserError, match="the policy in mine does not know .*trained on other words"):
        reviews.check_vocabulary(WordTokenizer(VOCAB[:-1]), "mine")  # no "."


# ----------------------------------------------------------------------------- empty prompts
@pytest.mark.parametrize("empty", ["", " \t "])
def test_a_prompts_file_with_an_empty_prompt_exits_2_naming_file_and_line(stages, tmp_path,
                                                                          capsys, empty):
    root, _, _ = stages
    prompts = write_jsonl(tmp_path / "prompts.jsonl",
                          [{"prompt": "the film was"}, {"prompt": empty}, {"prompt": "the plot"}])
    argv = ["--prompts", prompts, "--sft_dir", str(root / "sft"), "--rm_dir", str(root / "rm"),
            "--out_dir", str(tmp_path / "ppo"), "--max_iters", "1", "--rollout_batch_size", "8",
            "--minibatch_size", "8", "--eval_prompts", "2", "--max_new_tokens", "8", "--ptx_coef", "0"]
    with pytest.raises(SystemExit) as e:
        run(train_ppo.main, train_ppo.Config, argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{prompts}:2:" in err and "empty" in err and "Traceback" not in err


def test_encode_prompt_refuses_a_prompt_without_tokens():
    tokenizer = get_task("reviews").tokenizer()
    assert encode_prompt(tokenizer, "the film was", 2) == tokenizer.encode("film was")
    for empty in ("", "   "):
        with pytest.raises(UserError, match="no tokens"):
            encode_prompt(tokenizer, empty, 8)


def test_a_pair_without_prompt_scores_from_its_second_token_packed_or_not(monkeypatch):
    """Pairs may have an empty prompt (raw dialogues without a marker): the first token then
    has no position before it and is left out, the same in the padded and the packed pass."""
    from mingpt_rlhf.machinery import packing
    tokenizer = get_task("reviews").tokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **TINY)).eval()
    pairs = [PreferencePair("", "the film was superb .", "the film was dull ."),
             PreferencePair("the plot was very long and the cast seemed", "superb .", "dull .")]
    ids, mask, response = PairData(tokenizer, pairs, 48).batch([0, 1])
    sums = {}
    with torch.no_grad():
        for name, saving in (("padded", 2.0), ("packed", -1.0)):  # never / always pack
            monkeypatch.setattr(packing, "MIN_SAVING", saving)
            sums[name] = response_logprob_sums(model, ids, mask, response)
        logp = torch.log_softmax(model(ids[:1], mask[:1]).float(), -1)[0]  # the empty-prompt row
        n = int(mask[0].sum())
        by_hand = sum(logp[t - 1, ids[0, t]] for t in range(1, n))  # from the second token
    torch.testing.assert_close(sums["packed"], sums["padded"], atol=1e-5, rtol=0)
    torch.testing.assert_close(sums["padded"][0], by_hand, atol=1e-5, rtol=0)


def test_dpo_samples_its_eval_on_the_pairs_that_have_a_prompt(stages, tmp_path):
    root, _, _ = stages
    pair = {"prompt": "the film was", "chosen": "superb .", "rejected": "dull ."}
    bare = {"prompt": "", "chosen": "the film was superb .", "rejected": "the film was dull ."}
    cfg = lambda name, eval_rows: train_dpo.Config(
        out_dir=str(tmp_path / name), sft_dir=str(root / "sft"), batch_size=8, warmup_iters=1,
        eval_interval=10, eval_prompts=4, max_new_tokens=8,
        data=write_jsonl(tmp_path / "train.jsonl", [pair, bare] * 4),
        eval_data=write_jsonl(tmp_path / f"{name}.jsonl", eval_rows))
    assert "kl" in train_dpo.main(cfg("some", [bare, pair]))
    with pytest.raises(UserError, match="every held-out pair has an empty prompt"):
        train_dpo.main(cfg("none", [bare]))


# ----------------------------------------------------------------------------- the sort split
def training_problems(task):
    return ({p for p, _ in task.sft_examples("train")} | set(task.prompts("train"))
            | {pair.prompt for pair in task.preference_pairs("train")})


def digits(prompt):
    return tuple(sorted(prompt.split()[1:-1]))


def test_sort_held_out_split_is_fixed_by_the_task_and_kept_out_of_every_seeds_training():
    a, b = get_task("sort", seed=1337), get_task("sort", seed=0)
    held_out = set(a.prompts("eval")) | {p for p, _ in a.sft_examples("eval")} | \
        {pair.prompt for pair in a.preference_pairs("eval")}
    assert a.prompts("eval") == b.prompts("eval")
    assert [p for p, _ in a.sft_examples("eval")] == [p for p, _ in b.sft_examples("eval")]
    assert len(set(a.prompts("eval"))) == 200
    for task in (a, b, get_task("sort", seed=7)):
        assert not held_out & training_problems(task)
    # the seed still picks the training data
    assert a.prompts("train") != b.prompts("train")


def test_unseen_sort_problems_have_digits_no_training_split_holds():
    tasks = [get_task("sort", seed=s) for s in (1337, 0)]
    eval_prompts = tasks[0].prompts("eval")
    unseen = [p for p in eval_prompts if tasks[0].unseen(p)]
    assert 50 <= len(unseen) < len(eval_prompts)  # enough for a figure, and not all of them
    trained_digits = {digits(p) for task in tasks for p in training_problems(task)}
    assert not {digits(p) for p in unseen} & trained_digits
    # the others do share their digits with training (what "held out" alone would hide)
    assert any(digits(p) in trained_digits for p in eval_prompts if not tasks[0].unseen(p))
    # the figure: the check's mean over the unseen prompts only
    right = [" ".join(digits(p)) + " <eos>" for p in eval_prompts]
    wrong_on_seen = [r if tasks[0].unseen(p) else "<eos>" for p, r in zip(eval_prompts, right)]
    assert tasks[0].extra_eval_figures(eval_prompts, wrong_on_seen) == {"gold_unseen": 1.0}
    assert get_task("reviews").extra_eval_figures(["the film was"], ["dull . <eos>"]) == {}


@pytest.mark.parametrize("task, logged", [("sort", True), ("reviews", False)])
def test_ppo_eval_logs_gold_unseen_for_the_sort_task_only(tmp_path, task, logged):
    sft = random_policy(tmp_path / "sft", task)
    train_ppo.main(grpo_on_task(tmp_path / "ppo", sft, task))
    evals = [e for e in read_metrics(tmp_path / "ppo") if e.get("split") == "eval"]
    assert evals and all(("gold_unseen" in e) == logged for e in evals)


# ----------------------------------------------------------------------------- LoRA in bf16
def test_lora_merge_starts_from_the_float32_base_not_the_bf16_copy():
    """hold_frozen_in holds the frozen base in bf16 for speed; the merged checkpoint must still
    be the float32 starting weights + (alpha / r) B A, and every other frozen tensor (biases,
    a Linear layer without adapters) exactly as loaded."""
    from mingpt_rlhf.machinery.lora import LoRALinear, add_lora, merged_state_dict
    from mingpt_rlhf.machinery.runtime import hold_frozen_in
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=19, block_size=16, n_layer=2, n_head=2, n_embd=32))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    add_lora(model, 4, 8.0, targets=("c_attn", "c_fc"))  # attn.c_proj, mlp.c_proj stay plain
    for m in model.modules():
        if isinstance(m, LoRALinear):
            torch.nn.init.normal_(m.lora_B, std=0.1)
    hold_frozen_in(model, torch.bfloat16)
    assert model.transformer.h[0].attn.c_attn.weight.dtype == torch.bfloat16  # held in bf16
    merged = merged_state_dict(model)
    assert set(merged) == set(start)
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            start[f"{name}.weight"] = start[f"{name}.weight"] + 2.0 * (m.lora_B @ m.lora_A).detach()
    for k, v in start.items():
        assert merged[k].dtype == torch.float32, k
        torch.testing.assert_close(merged[k], v, atol=1e-7, rtol=1e-6, msg=k)


def test_a_bf16_lora_ppo_run_saves_the_sft_weights_plus_its_adapters(stages, tmp_path):
    root, _, _ = stages
    train_ppo.main(ppo_cfg(tmp_path / "ppo", root / "sft", root / "rm", max_iters=2,
                           lora_rank=4, lora_alpha=8.0, dtype="bfloat16"))
    sft = torch.load(root / "sft" / "ckpt.pt", weights_only=False)["model"]
    ckpt = torch.load(tmp_path / "ppo" / "ckpt.pt", weights_only=False)
    adapters = ckpt["actor"]["lora"]
    assert any(b.abs().max() > 0 for k, b in adapters.items() if k.endswith("lora_B"))
    for k, saved in ckpt["model"].items():
        expected = sft[k].float()
        if k.replace("weight", "lora_A") in adapters:
            a, b = adapters[k.replace("weight", "lora_A")], adapters[k.replace("weight", "lora_B")]
            expected = expected + (8.0 / 4) * (b.float() @ a.float())
        torch.testing.assert_close(saved.float(), expected, atol=1e-7, rtol=1e-6, msg=k)


@pytest.mark.parametrize("stats,cause", [
    ({"minibatch_steps": 0, "early_stop_kl": 0.05}, "approx-KL 0.05 already passed --target_kl 0.02"),
    ({"minibatch_steps": 0, "early_stop_kl": 0.0, "kept_rows": 0}, "dynamic sampling kept no group"),
    ({"minibatch_steps": 0, "early_stop_kl": 0.0}, "every loss was non-finite"),
])
def test_an_update_that_took_no_step_is_said_with_its_cause(stats, cause):
    line = idle_update_warning(stats, 7, 0.02)
    assert line.startswith("warning: iteration 7's update took no optimizer step") and cause in line
