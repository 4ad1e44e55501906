"""A whole conversation as one training sequence for supervised fine-tuning: its token ids, and a
loss mask that is 1 on the assistant's tokens only (docs/algorithms.md#sft).

The chat template renders the whole conversation once. An assistant message's span of that text
begins where the rendering of the messages before it, *with* the generation prompt (the
``<|im_start|>assistant\n`` the model never writes), ends, and runs through the template's
end-of-turn token that follows (what the model writes last; the template's newline after it is
formatting), or, for a template without one, to where the rendering through the message ends.
What the template writes inside an assistant turn is trained on as the model would write it (a
Qwen3-style empty ``<think>`` block in the last turn, tool calls); the text is tokenized once, with
character offsets, and a token is trained on when it starts inside an assistant span. System, user
and tool messages, the generation prompts and the template's framing are never trained on. A
template that drops earlier turns' reasoning (Qwen3) drops it here too: the sequence is the
conversation as the template renders it.

This needs a template whose rendering of a conversation begins with its rendering of the messages
before each assistant message plus the generation prompt (true of ChatML, Llama, Qwen and most);
one that does not is refused with the message index, as are tool calls for a template that does
not read ``tools``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from telescope_rollout._types import Message
from telescope_rollout.chat._template import TemplateError
from telescope_rollout.chat._tokens import Tokenizer

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ConversationTokens:
    """A conversation's ``ids`` and its ``mask`` (1 on assistant tokens), and the rendered ``text``."""

    ids: list[int]
    mask: list[int]
    text: str


def _check(messages: list[Message]) -> None:
    if not messages:
        raise ValueError("a conversation needs at least one message")
    for i, m in enumerate(messages):
        role = cast("Any", m).get("role") if isinstance(cast("Any", m), dict) else None
        if role not in ROLES:
            raise ValueError(f"message {i} has role {role!r}; a conversation's roles are {', '.join(ROLES)}")
        if not isinstance(m.get("content", ""), str | None) and role != "assistant":
            raise ValueError(f"message {i} ({role}): content must be text")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant message: nothing to train on")


def _generation_prompt(template: Any, messages: list[Message], tools: Any) -> str:
    """The rendering of ``messages`` with the generation prompt; for none, the template's own
    opening (a default system prompt) when it renders an empty conversation."""
    if messages:
        return str(template.render(messages, add_generation_prompt=True, tools=tools))
    try:
        return str(template.render([], add_generation_prompt=True, tools=tools))
    except TemplateError:
        return ""


def _assistant_spans(
    tokenizer: Tokenizer, messages: list[Message], tools: Any
) -> tuple[str, list[tuple[int, int]]]:
    template = tokenizer.template
    if template is None:
        raise TemplateError("this tokenizer has no chat template; set `chat_template` in the config")
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages) and not template.supports_tools:
        raise TemplateError("the conversation has tool calls and the chat template does not read `tools`")
    text = template.render(messages, tools=tools)
    eos = tokenizer.eos_token or ""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _generation_prompt(template, messages[:i], tools)
        if not text.startswith(before):
            raise TemplateError(
                f"the chat template renders the conversation differently from the messages before assistant "
                f"message {i} with the generation prompt: the assistant's tokens cannot be told apart; use "
                "a template that renders each message on its own"
            )
        start = len(before)
        # the span ends within the rendering through this message (rendered as the last one, a turn
        # may hold more, e.g. an empty think block: never less), at the end-of-turn token if any
        through = template.render(messages[: i + 1], tools=tools)
        limit = (
            len(through) if text.startswith(through) else min(len(text), start + len(through) - len(before))
        )
        end = text.find(eos, start, limit) if eos else -1
        spans.append((start, end + len(eos) if end >= 0 else limit))
    return text, spans


def conversation_tokens(
    tokenizer: Tokenizer, messages: list[Message], *, tools: list[dict[str, Any]] | None = None
) -> ConversationTokens:
    """The conversation ``messages`` (roles system, user, assistant, tool; assistant messages may hold
    ``tool_calls``) as one sequence with its assistant mask (module docstring). Bad input raises
    ``ValueError`` or ``TemplateError`` naming the message."""
    _check(messages)
    text, spans = _assistant_spans(tokenizer, messages, tools)
    encoding = tokenizer.backend.encode(text, add_special_tokens=False)
    ids = list(encoding.ids)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in encoding.offsets]
    if not any(mask):
        raise ValueError("the assistant messages rendered to no token: nothing to train on")
    return ConversationTokens(ids, mask, text)
