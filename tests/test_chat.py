"""Chat formats: conversations rendered as each family's template writes them (expected strings
written by hand from the templates), which of their text the policy writes, SFT's loss on the
assistant's turns only, BOS and EOS where the model expects them, the readers of messages
lines and their mistakes, and a tiny run through SFT, RM and GRPO on conversations."""
import json
import os
import shutil

import pytest
import torch

from mingpt_rlhf.machinery.chat import (PLAIN, UNKNOWN, ChatFormat, conversation_of,
                                        format_of_template, pair_texts, prompt_text, render,
                                        transcript)
from mingpt_rlhf.data import (IGNORE, PairData, SFTData, encode_example, encode_prompt,
                              load_preference_jsonl, load_prompt_rows, load_sft_jsonl)
from mingpt_rlhf.machinery.bpe import BPETokenizer
from mingpt_rlhf.machinery.errors import UserError
from test_tokenizer_json import FIXTURES

QWEN25 = ChatFormat("chatml", "<|im_end|>", None,
                    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
QWEN3 = ChatFormat("qwen3", "<|im_end|>")
LLAMA31 = ChatFormat("llama3", "<|eot_id|>", "<|begin_of_text|>", None,
                     "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")
LLAMA30 = ChatFormat("llama3", "<|eot_id|>", "<|begin_of_text|>")
TWO_TURNS = [("system", "S"), ("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")]


def whole_text(fmt, messages):
    """The transcript written out as the template writes the whole conversation: each answer
    followed by its end-of-turn token (and, ChatML, the newline after it)."""
    turns = transcript(fmt, messages)
    tail = "\n" if fmt.name in ("chatml", "qwen3") else ""
    return "".join(t + (fmt.end_of_turn if who == "policy" else "") for who, t in turns) + tail


def test_chatml_as_qwen25s_template_writes_it():
    assert whole_text(QWEN25, [("user", "Hi"), ("assistant", "Hello!")]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n")
    assert whole_text(QWEN25, TWO_TURNS) == (  # a system message of its own: no default
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
        "A1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\nA2<|im_end|>\n")
    assert transcript(QWEN25, TWO_TURNS)[1:] == [
        ("policy", "A1"), ("env", "\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"),
        ("policy", "A2")]


def test_qwen3_thinking_off_as_its_template_writes_it():
    # the last answer after the last question gets the empty think block; earlier ones do not
    assert whole_text(QWEN3, TWO_TURNS) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
        "A1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "A2<|im_end|>\n")
    # ... and it is the prompt's, as the generation prompt writes it with thinking off
    assert transcript(QWEN3, TWO_TURNS)[-1] == ("policy", "A2")
    assert prompt_text(QWEN3, [("user", "Q")]) == \
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # reasoning in an answer: kept (the policy writes it) in the last, dropped in an earlier one
    reasoned = [("user", "Q1"), ("assistant", "<think>\nr1\n</think>\n\nA1"), ("user", "Q2"),
                ("assistant", "<think>r2</think>A2")]
    assert [t for who, t in transcript(QWEN3, reasoned) if who == "policy"] == \
        ["A1", "<think>\nr2\n</think>\n\nA2"]


def test_llama3_as_its_templates_write_it():
    assert whole_text(LLAMA31, [("system", "  S \n"), ("user", " Q"), ("assistant", " A \n")]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
        "December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>")
    assert prompt_text(LLAMA31, [("user", "Q")]) == (  # 3.1+: the system header, always
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
        "December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert prompt_text(LLAMA30, [("system", "S"), ("user", "Q")]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n")


def test_plain_is_the_contents_as_they_are():
    assert transcript(PLAIN, TWO_TURNS) == [("env", "S\nQ1"), ("policy", "A1"), ("env", "Q2"),
                                            ("policy", "A2")]
    assert prompt_text(PLAIN, [("system", "Be kind."), ("user", "Hi")]) == "Be kind.\nHi"
    assert pair_texts(PLAIN, [("user", "Hi")], "Hello", "Go", "x") == ("Hi", "Hello", "Go")
    with pytest.raises(UserError, match="plain format"):
        prompt_text(PLAIN, TWO_TURNS[:4])


def test_a_pair_shares_the_prompt_its_answers_continue():
    history = TWO_TURNS[:4]
    for fmt in (QWEN25, QWEN3, LLAMA31):
        prompt, chosen, rejected = pair_texts(fmt, history, " Yes \n", "No", "x")
        assert prompt == prompt_text(fmt, history)
        assert (chosen, rejected) == (("Yes", "No") if fmt is LLAMA31 else (" Yes \n", "No"))
    with pytest.raises(UserError, match="different prompts"):
        pair_texts(QWEN3, history, "<think>r</think>Yes", "No", "x")


def test_the_format_is_read_from_the_template():
    chatml = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>"
              "system\\nYou are tiny.<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' "
              "+ m['content'] + '<|im_end|>\\n' }}{% endfor %}")
    assert format_of_template(chatml, None) == ChatFormat("chatml", "<|im_end|>", None, "You are tiny.")
    qwen3 = "{{- '<|im_start|>' + m.content + '<|im_end|>' }}{{- '<think>\\n\\n</think>\\n\\n' }}"
    assert format_of_template(qwen3, None) == QWEN3
    llama = ("{{- bos_token }}{%- set date_string = \"26 Jul 2024\" %}{{- '<|start_header_id|>' }}"
             "{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- '<|eot_id|>' }}")
    assert format_of_template(llama, "<|begin_of_text|>") == LLAMA31
    llama30 = "{{ bos_token + '<|start_header_id|>' + m['role'] + '<|end_header_id|>' + '<|eot_id|>' }}"
    assert format_of_template(llama30, "<|begin_of_text|>") == LLAMA30
    assert format_of_template(None, "<s>") == PLAIN
    assert format_of_template("<start_of_turn>{{ m }}<end_of_turn>", "<bos>") == UNKNOWN


@pytest.fixture(scope="module")
def toks():
    return {f: BPETokenizer.from_pretrained(os.path.join(FIXTURES, f)) for f in ("qwen3", "llama3")}


def test_sft_learns_the_assistants_turns_and_their_end_only(toks):
    """The trained targets of a conversation are exactly each answer's tokens and EOS (the
    end-of-turn token); Llama 3's BOS stands once, first (its template writes it)."""
    for family, eos in (("qwen3", "<|im_end|>"), ("llama3", "<|eot_id|>")):
        tok = toks[family]
        data = SFTData(tok, [conversation_of([{"role": r, "content": c} for r, c in TWO_TURNS], "x")], 512)
        inputs, targets = data.batch([0])
        assert tok.decode(targets[targets != IGNORE].tolist()) == f"A1{eos}A2{eos}"
        ids = data.examples[0][0]
        assert ids.count(tok.bos_id) == (1 if family == "llama3" else 0) and ids[:1] != [tok.pad_id]
        assert ids[-1] == tok.eos_id


def test_bos_first_in_every_sequence_and_kept_when_cut(toks):
    tok = toks["llama3"]
    ids, n_prompt = encode_example(tok, "the end " * 60, "ok", block_size=24)
    assert len(ids) == 24 and ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids[-1] == tok.eos_id and tok.decode(ids[1:n_prompt]).endswith("end ")
    prompt = encode_prompt(tok, "the end " * 60, max_len=10)
    assert len(prompt) == 10 and prompt[0] == tok.bos_id
    rendered = prompt_text(tok.chat_format, [("user", "hi")])  # writes <|begin_of_text|> itself
    assert encode_prompt(tok, rendered, 500).count(tok.bos_id) == 1
    assert encode_example(toks["qwen3"], "a", "b", 8)[0][0] != tok.bos_id  # no BOS declared


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_messages_lines_of_pairs_and_prompts_are_rendered_in_the_policys_format(tmp_path, toks):
    tok = toks["llama3"]
    pairs = load_preference_jsonl(write(tmp_path / "p.jsonl", [
        {"messages": msgs(("user", "Hi")), "chosen": " Hello ", "rejected": "Go"}]), tok.chat_format)
    assert pairs[0].prompt == prompt_text(tok.chat_format, [("user", "Hi")])
    assert (pairs[0].chosen, pairs[0].rejected) == ("Hello", "Go")
    batch_ids, mask, response = PairData(tok, pairs, 128).batch([0])
    for row in range(2):  # each row: BOS first, the answer, then EOS where the RM reads its score
        real = batch_ids[row][mask[row].bool()].tolist()
        assert real[0] == tok.bos_id and real[-1] == tok.eos_id == tok.encoder["<|eot_id|>"]
    rows = load_prompt_rows(write(tmp_path / "q.jsonl", [
        {"messages": msgs(("system", "S"), ("user", "Q")), "answer": "4"}]), tok.chat_format)
    assert rows == [{"prompt": prompt_text(tok.chat_format, [("system", "S"), ("user", "Q")]), "answer": "4"}]
    demos = load_sft_jsonl(write(tmp_path / "d.jsonl", [{"messages": msgs(("user", "Q"), ("assistant", "A"))},
                                                        {"prompt": "p", "response": "r"}]))
    assert demos[0] == [("user", "Q"), ("assistant", "A")] and demos[1] == ("p", "r")


MISTAKES = [  # (loader, line, words of the one-line error)
    ("sft", {"messages": msgs(("user", "Q"), ("bot", "A"))}, "role 'bot'"),
    ("sft", {"messages": msgs(("system", "S"), ("user", "Q"))}, "no assistant message"),
    ("sft", {"messages": [{"role": "user", "content": "Q", "name": "x"}]}, "nothing else"),
    ("sft", {"messages": [{"role": "user", "content": 3}]}, "content"),
    ("sft", {"messages": []}, "non-empty"),
    ("sft", {"messages": msgs(("user", "Q"), ("assistant", "A")), "prompt": "p", "response": "r"}, "not both"),
    ("pairs", {"messages": msgs(("user", "Q"), ("assistant", "A")), "chosen": "a", "rejected": "b"},
     "ends with an assistant message"),
    ("pairs", {"messages": "Q", "chosen": "a", "rejected": "b"}, "non-empty list"),
    ("prompts", {"messages": msgs(("user", "Q"), ("assistant", "A"))}, "ends with an assistant message"),
    ("prompts", {"messages": msgs(("user", "Q")), "prompt": "Q"}, "not both"),
]


@pytest.mark.parametrize("loader,row,words", MISTAKES)
def test_mistakes_in_messages_lines_name_the_line(tmp_path, loader, row, words):
    path = write(tmp_path / "x.jsonl", [row])
    load = {"sft": load_sft_jsonl, "pairs": load_preference_jsonl, "prompts": load_prompt_rows}[loader]
    with pytest.raises(UserError, match=words) as e:
        load(path)
    assert str(e.value).startswith(f"{path}:1:") and "\n" not in str(e.value)


def test_render_marks_what_the_policy_writes():
    turns = render(QWEN25, [("user", "Q")], answer_next=True)
    assert turns == [("env", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                             "helpful assistant.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                             "<|im_start|>assistant\n")]


def test_sft_rm_grpo_on_conversations_with_a_familys_tokenizer(tmp_path):
    """A tiny random GPT (GPT-2's layout) in a folder with Llama 3's tokenizer files: SFT on
    messages, a reward model on message pairs, GRPO on message prompts, each stage reading the
    tokenizer the folder gave the first one."""
    import train_ppo
    import train_rm
    import train_sft
    from mingpt_rlhf.tokenizer import same_tokenizer, tokenizer_from_state
    from test_pretrained import gpt2_raw, write_safetensors
    folder = shutil.copytree(os.path.join(FIXTURES, "llama3"), tmp_path / "model")
    tok = BPETokenizer.from_pretrained(str(folder))
    raw = gpt2_raw(vocab=tok.n_tokens)
    raw["wpe.weight"] = torch.randn(160, raw["wpe.weight"].size(1)) * 0.02
    write_safetensors(folder / "model.safetensors", raw)
    (folder / "config.json").write_text(json.dumps({"n_head": 4}))
    talk = [(f"what is {a} plus {a}?", f"{2 * a}.") for a in range(6)]
    demos = write(tmp_path / "demos.jsonl", [{"messages": msgs(("user", q), ("assistant", r))} for q, r in talk])
    prefs = write(tmp_path / "prefs.jsonl", [{"messages": msgs(("user", q)), "chosen": r, "rejected": "no"}
                                             for q, r in talk])
    prompts = write(tmp_path / "prompts.jsonl", [{"messages": msgs(("user", q))} for q, _ in talk])

    sft = train_sft.main(train_sft.Config(out_dir=str(tmp_path / "sft"), init_from=str(folder),
                                          data=demos, max_iters=2, eval_interval=2, batch_size=4,
                                          warmup_iters=1))
    ckpt = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=False)
    assert sft["final"] and same_tokenizer(tokenizer_from_state(ckpt["tokenizer"]), tok)
    assert ckpt["model_config"]["vocab_size"] == tok.vocab_size == tok.n_tokens + 1  # PAD's row
    rm = train_rm.main(train_rm.Config(out_dir=str(tmp_path / "rm"), sft_dir=str(tmp_path / "sft"),
                                       data=prefs, batch_size=2, eval_interval=2, norm_samples=2,
                                       max_new_tokens=4))
    assert 0 <= rm["eval_acc"] <= 1
    grpo = train_ppo.main(train_ppo.Config(
        out_dir=str(tmp_path / "grpo"), sft_dir=str(tmp_path / "sft"), rm_dir=str(tmp_path / "rm"),
        prompts=prompts, algo="grpo", group_size=2, ptx_coef=0.0, max_iters=1,
        rollout_batch_size=4, minibatch_size=4, ppo_epochs=1, max_new_tokens=4, eval_interval=1,
        eval_prompts=2))
    assert grpo["final"] and "rm_score" in grpo


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3", "smollm2"])
def test_turn_by_turn_ids_are_the_whole_texts_but_after_a_leading_newline(family):
    """SFT tokenizes each turn on its own (as sampling produces it): the ids are those of the
    whole conversation's text, except where an answer starts with white space holding a
    newline, which the header's newline may then join (not tested: it depends on the merges)."""
    from mingpt_rlhf.data import encode_transcript
    tok = BPETokenizer.from_pretrained(os.path.join(FIXTURES, family))
    fmt = tok.chat_format
    for answer in ("4.", " Hello there", "(x) y", "'s fine", "12345 apples", "tabs\tand\n\nlines\n"):
        conversation = [("user", "What is 2+2?"), ("assistant", answer), ("user", "Why?"),
                        ("assistant", answer)]
        ids, _ = encode_transcript(tok, transcript(fmt, conversation))
        assert ids == tok.encode(whole_text(fmt, conversation).removesuffix("\n")), answer
