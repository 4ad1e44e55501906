"""Anthropic's Messages API (``POST /v1/messages``) over the gateway's OpenAI form.

A harness that speaks Anthropic's API (its SDK, or a command-line agent built on it) reaches the
same episode: :func:`openai_request` turns its request into the OpenAI chat request the gateway
plans (``system`` as a system message; ``text`` blocks as content; ``tool_use`` blocks as the
assistant's ``tool_calls``; ``tool_result`` blocks as ``tool`` messages; ``tools`` with their
``input_schema`` as function tools; ``tool_choice`` ``auto``/``none``), so token-in/token-out,
splits and refusals are the chat endpoint's. :func:`message_response` and :func:`message_events`
give the answer back as a ``message`` object or as its server-sent events (``message_start``,
``content_block_start``/``_delta``/``_stop``, ``message_delta``, ``message_stop``);
:func:`error_body` is Anthropic's error shape. Only text and tool blocks are read; images,
documents and thinking blocks are refused with the reason.
"""

from __future__ import annotations

import json
from typing import Any, cast

from telescope_rollout.gateway._messages import RequestError

__all__ = ["error_body", "message_events", "message_response", "openai_request"]

_STOP = {"tool_calls": "tool_use", "length": "max_tokens"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    410: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _blocks(content: object, where: str) -> list[dict[str, Any]]:
    """``content`` as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) for b in cast(list[object], content)):
        return cast(list[dict[str, Any]], content)
    raise RequestError(
        f"{where}.content must be a string or a list of content blocks", param=f"{where}.content"
    )


def _text(value: object, where: str) -> str:
    """A ``tool_result``'s content as text (a string, or its text blocks joined; others refused)."""
    if isinstance(value, str) or value is None:
        return value or ""
    blocks = _blocks(value, where)
    if any(b.get("type") != "text" for b in blocks):
        raise RequestError(
            f"{where} holds a block other than text: only text results are supported", param=where
        )
    return "".join(str(b.get("text", "")) for b in blocks)


def _message(raw: object, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI messages (a user turn's tool results become tool messages)."""
    entry = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
    role, where = entry.get("role"), f"messages[{i}]"
    if role not in ("user", "assistant"):
        raise RequestError(f"{where}.role must be user or assistant, got {role!r}", param=f"{where}.role")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(entry.get("content"), where)):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _text(block.get("content"), f"{where}.content[{j}].content"),
                }
            )
        else:
            raise RequestError(
                f"{where}.content[{j}] is a {kind!r} block: only text, tool_use (assistant) and tool_result "
                "(user) blocks are supported",
                param=f"{where}.content",
            )
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})}]
    return [*results, *([{"role": "user", "content": "".join(texts)}] if texts or not results else [])]


def _tools(value: object) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError("tools must be a list", param="tools")
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(cast(list[object], value)):
        tool = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        if not isinstance(tool.get("name"), str) or tool.get("type", "custom") != "custom":
            raise RequestError(
                f"tools[{i}] must be a custom tool with a name and an input_schema (server tools such as "
                "web search run on Anthropic's side, which this endpoint is not)",
                param=f"tools[{i}]",
            )
        function: dict[str, Any] = {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {},
        }
        out.append({"type": "function", "function": function})
    return out


def openai_request(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as the OpenAI chat request the gateway answers (module docstring)."""
    messages: list[dict[str, Any]] = []
    system: object = body.get("system")
    if system:
        text = (
            system
            if isinstance(system, str)
            else "".join(str(b.get("text", "")) for b in _blocks(system, "system"))
        )
        messages.append({"role": "system", "content": text})
    raw: object = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list", param="messages")
    for i, message in enumerate(cast(list[object], raw)):
        messages += _message(message, i)
    choice: object = body.get("tool_choice")
    kind = cast(dict[str, Any], choice).get("type") if isinstance(choice, dict) else None
    if kind not in (None, "auto", "none"):
        raise RequestError(
            "tool_choice must be auto or none: forcing a call needs constrained decoding, which changes the "
            "sampling distribution",
            param="tool_choice",
        )
    out: dict[str, Any] = {
        "messages": messages,
        "tools": _tools(body.get("tools")),
        "stream": bool(body.get("stream")),
    }
    if kind is not None:
        out["tool_choice"] = kind
    if body.get("max_tokens") is not None:
        out["max_tokens"] = body["max_tokens"]
    return out


def message_response(
    response_id: str, model: str, message: dict[str, Any], finish_reason: str, usage: tuple[int, int]
) -> dict[str, Any]:
    """The answer (an OpenAI assistant message) as an Anthropic ``message`` object."""
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls: list[dict[str, Any]] = message.get("tool_calls") or []
    for call in calls:
        fn: dict[str, Any] = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"])}
        )
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP.get(finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def message_events(whole: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A ``message`` object as the ``(event, data)`` pairs of Anthropic's stream."""
    start: dict[str, Any] = {
        **whole,
        "content": [],
        "stop_reason": None,
        "usage": {**whole["usage"], "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    blocks: list[dict[str, Any]] = whole["content"]
    for i, block in enumerate(blocks):
        first: dict[str, Any]
        if block["type"] == "text":
            first, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            first = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
        events += [
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": first}),
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]
    end = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": end,
                "usage": {"output_tokens": whole["usage"]["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def error_body(err: RequestError) -> dict[str, Any]:
    """Anthropic's error object for a refused request."""
    kind = _ERROR_TYPES.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}
