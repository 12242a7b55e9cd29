"""Chat formats: a conversation written as the text an instruct model was trained on.

A JSONL row may hold a conversation instead of a prompt and a response:

    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}]}

An instruct model was fine-tuned on conversations written in one fixed format, each turn opened
and closed by special tokens; it answers well only in that format, and it ends its answer with
the format's end-of-turn token. So the end-of-turn token is the EOS: the sampler stops at it,
SFT teaches it, and the reward model reads its score there. The format is chosen from the chat
template in the model's tokenizer_config.json (machinery/tokenizer_json.py); we write each one
in our own code, no template engine:

- plain (GPT-2, the built-in tasks' word tokenizer, a tokenizer without a chat template): the
  contents as they are, no markers; consecutive system / user messages joined by a newline.
  A prompt and its answer are then what a {"prompt", "response"} row gives.
- chatml (Qwen2, Qwen2.5, SmolLM2): `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message,
  and a default system message when the conversation has none, if the template writes one
  (Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.").
- qwen3: ChatML without a default system message; thinking is off: an answer follows an empty
  `<think>\\n\\n</think>\\n\\n` block, as Qwen3's template writes it when thinking is disabled
  (and for the last answer of a conversation). An answer holding its own `<think>...</think>`
  is written as the template writes it: the reasoning kept in the last answer, dropped before.
- llama3: `<|begin_of_text|>` once, then `<|start_header_id|>{role}<|end_header_id|>\\n\\n
  {content, stripped}<|eot_id|>` per message. Llama 3.1 and later write a system header first,
  always: "Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n" and then the
  system message, if any. (Their template puts today's date there when transformers renders
  it; we write the template's fixed date, so the same data always gives the same tokens.)

What the policy writes. A rendered conversation is an episode transcript (data.Transcript):
everything up to an assistant's content (the turn's header included) is the environment's
turn, each assistant content a policy turn, which the EOS (the end-of-turn token) ends; SFT
trains on the policy turns only, as on an episode's, through the same encoder
(data.encode_transcript). Each turn is tokenized on its own, as sampling produces it (the
ids can differ from tokenizing the whole text at once only where an answer starts with a
newline that the header's newline would have joined). A prompt (PPO prompts, preference pairs)
is the rendered conversation up to and including the next answer's header (the "generation
prompt"); an earlier answer in it is written with its end-of-turn token's text, which the
tokenizer reads back as that token.

Try it:  python -c "from mingpt_rlhf.machinery.chat import ChatFormat, prompt_text; print(prompt_text(ChatFormat('chatml', '<|im_end|>'), [('user', 'Hi')]))"
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UserError

ROLES = ("system", "user", "assistant")
EMPTY_THINK = "<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class ChatFormat:
    name: str = "plain"                 # a key of RENDERERS
    end_of_turn: str | None = None      # the token ending each turn, the EOS (plain: the tokenizer's)
    bos: str | None = None              # written first (Llama 3's <|begin_of_text|>), or None
    default_system: str | None = None   # chatml: the system message of a conversation without one
    system_preamble: str | None = None  # llama3 (3.1+): the system header's first lines


PLAIN = ChatFormat()
UNKNOWN = ChatFormat("unknown")  # a chat template of another kind: conversations are refused


def format_of_template(template: str | None, bos_token: str | None) -> ChatFormat:
    """The format a chat template writes, read from its text; PLAIN without a template, UNKNOWN
    for a template of another kind. The template is Jinja source: its strings hold "\\n" as
    two characters, turned into newlines here before matching."""
    if template is None:
        return PLAIN
    t = template.replace("\\n", "\n")
    bos = bos_token if re.search(r"\bbos_token\b", t) else None
    if "<|start_header_id|>" in t and "<|eot_id|>" in t:
        preamble = None
        if "Cutting Knowledge Date:" in t:
            knowledge = re.search(r"Cutting Knowledge Date: ([^\n\"']+)", t)
            date = re.search(r"date_string = [\"']([^\"']+)[\"']", t)
            if not (knowledge and date):
                return UNKNOWN
            preamble = f"Cutting Knowledge Date: {knowledge[1]}\nToday Date: {date[1]}\n\n"
        return ChatFormat("llama3", "<|eot_id|>", bos, None, preamble)
    if "<|im_start|>" in t and "<|im_end|>" in t:
        # a default system message is a literal: no quote, brace or "+" of Jinja inside it
        default = re.search(r"<\|im_start\|>system\n([^'\"{}+]*?)<\|im_end\|>", t)
        return ChatFormat("qwen3" if EMPTY_THINK in t else "chatml", "<|im_end|>", bos,
                          default[1] if default else None)
    return UNKNOWN


def chat_format_of(tokenizer) -> ChatFormat:
    """The tokenizer's chat format (PLAIN for GPT-2's and the word tokenizers)."""
    return getattr(tokenizer, "chat_format", None) or PLAIN


# ---- conversations -------------------------------------------------------------------------

class Conversation(list):
    """A JSONL row's "messages", checked: [(role, content), ...], role system | user | assistant."""


def conversation_of(messages, where: str) -> Conversation:
    """A Conversation from a row's "messages", or a UserError at `where` (file:line)."""
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}}")
    out = Conversation()
    for i, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str)):
            raise UserError(f"{where}: message {i} must be {{\"role\": ..., \"content\": str}} and "
                            f"nothing else, got {str(m)[:60]}")
        if m["role"] not in ROLES:
            raise UserError(f"{where}: message {i} has role {m['role']!r}; a role is one of "
                            f"{', '.join(ROLES)}")
        out.append((m["role"], m["content"]))
    return out


# ---- rendering -----------------------------------------------------------------------------

class _Turns:
    """Collects [(who, text), ...] with who "env" or "policy", joining consecutive env text. A
    separator after a policy turn is written only when something follows it."""

    def __init__(self):
        self.turns, self.separator = [["env", ""]], ""

    def env(self, text: str):
        text, self.separator = self.separator + text, ""
        if self.turns[-1][0] == "env":
            self.turns[-1][1] += text
        else:
            self.turns.append(["env", text])

    def policy(self, text: str, separator: str = ""):
        if self.separator:
            self.env("")
        self.turns.append(["policy", text])
        self.separator = separator


def _plain(fmt: ChatFormat, messages, out: _Turns, answer_next: bool):
    previous = None
    for role, content in messages:
        if role == "assistant":
            out.policy(content)
        else:
            out.env(("\n" if previous in ("system", "user") else "") + content)
        previous = role


def _last_query(messages) -> int:
    """Qwen3's template: the index of the last user message that is not a tool's response."""
    for i in range(len(messages) - 1, -1, -1):
        role, content = messages[i]
        if role == "user" and not (content.startswith("<tool_response>") and
                                   content.endswith("</tool_response>")):
            return i
    return len(messages) - 1


def _chatml(fmt: ChatFormat, messages, out: _Turns, answer_next: bool):
    qwen3 = fmt.name == "qwen3"
    out.env(fmt.bos or "")
    if fmt.default_system is not None and messages[0][0] != "system":
        out.env(f"<|im_start|>system\n{fmt.default_system}<|im_end|>\n")
    last_query = _last_query(messages)
    for i, (role, content) in enumerate(messages):
        if role != "assistant":
            out.env(f"<|im_start|>{role}\n{content}<|im_end|>\n")
            continue
        out.env("<|im_start|>assistant\n")
        if qwen3:
            reasoning = ""
            if "</think>" in content:
                reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                content = content.split("</think>")[-1].lstrip("\n")
            if i > last_query and (i == len(messages) - 1 or reasoning):
                content = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
            if content.startswith(EMPTY_THINK):  # what the prompt writes when thinking is off
                out.env(EMPTY_THINK)
                content = content[len(EMPTY_THINK):]
        out.policy(content, separator="\n")
    if answer_next:
        out.env("<|im_start|>assistant\n" + (EMPTY_THINK if qwen3 else ""))


def _llama3(fmt: ChatFormat, messages, out: _Turns, answer_next: bool):
    out.env(fmt.bos or "")
    if fmt.system_preamble is not None:  # 3.1 and later: a system header, always
        system = ""
        if messages[0][0] == "system":
            system, messages = messages[0][1].strip(), messages[1:]
        out.env(f"<|start_header_id|>system<|end_header_id|>\n\n{fmt.system_preamble}{system}<|eot_id|>")
    for role, content in messages:
        out.env(f"<|start_header_id|>{role}<|end_header_id|>\n\n")
        if role == "assistant":
            out.policy(content.strip())
        else:
            out.env(content.strip() + "<|eot_id|>")
    if answer_next:
        out.env("<|start_header_id|>assistant<|end_header_id|>\n\n")


# one function per format: (format, [(role, content), ...], _Turns to fill, whether a
# generation prompt for the next answer follows)
RENDERERS = {"plain": _plain, "chatml": _chatml, "qwen3": _chatml, "llama3": _llama3}


def render(fmt: ChatFormat, messages, answer_next: bool = False) -> list[tuple[str, str]]:
    """[(who, text), ...]: the conversation as environment and policy turns, the first one the
    environment's (maybe empty); with `answer_next`, ending with the next answer's header."""
    if fmt.name not in RENDERERS:
        raise UserError("the model's chat template (tokenizer_config.json) is none we write "
                        "(ChatML, Qwen3's, Llama 3's), so \"messages\" rows cannot be rendered; "
                        "give prompt / response rows, written in the model's format")
    out = _Turns()
    RENDERERS[fmt.name](fmt, list(messages), out, answer_next)
    return [(who, text) for who, text in out.turns]


def transcript(fmt: ChatFormat, messages) -> list[tuple[str, str]]:
    """The turns of the episode transcript SFT trains on (data.Transcript): policy turns are the
    assistant's answers; what follows the last answer is dropped (nothing there to learn)."""
    turns = render(fmt, messages)
    while turns and turns[-1][0] == "env":
        turns.pop()
    return turns


def _joined(fmt: ChatFormat, turns, where: str) -> str:
    """The text of turns, an earlier answer followed by its end-of-turn token's text."""
    if fmt.end_of_turn is None and any(who == "policy" for who, _ in turns):
        raise UserError(f"{where}: the prompt holds an assistant message, but the plain format "
                        f"(GPT-2, the built-in word tokenizers) has no end-of-turn text to close "
                        f"it with; give the prompt as text, or use a model with a chat format")
    return "".join(text + (fmt.end_of_turn if who == "policy" else "") for who, text in turns)


def prompt_text(fmt: ChatFormat, messages, where: str = "prompt") -> str:
    """The prompt a conversation ending with a user (or system) message asks the policy to
    answer: the rendered conversation and the next answer's header."""
    return _joined(fmt, render(fmt, messages, answer_next=True), where)


def pair_texts(fmt: ChatFormat, messages, chosen: str, rejected: str, where: str):
    """(prompt, chosen, rejected) texts of a preference pair over a conversation: each answer
    rendered as the conversation's next assistant turn. Both must share their prompt (they do,
    except with Qwen3 when one answer holds a <think> block and the other not)."""
    out = []
    for answer in (chosen, rejected):
        turns = render(fmt, [*messages, ("assistant", answer)])
        while turns[-1][0] == "env":  # the separator after the answer, if any
            turns.pop()
        out.append((_joined(fmt, turns[:-1], where), turns[-1][1]))
    if out[0][0] != out[1][0]:
        raise UserError(f"{where}: the chosen and rejected answers render different prompts "
                        f"(one holds a <think> block); give both with or both without one")
    return out[0][0], out[0][1], out[1][1]
