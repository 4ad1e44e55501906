"""OpenAI's request rules and response shapes, as the agent gateway speaks them.

What changes the sampling distribution is refused with the reason (the trained logprobs would no
longer describe it): ``n`` other than 1, ``logit_bias``, ``response_format`` other than text,
penalties, guided decoding, a forced ``tool_choice``. ``temperature``, ``top_p`` and ``seed`` are
the run's (the config's sampling settings), whatever the request says. ``max_tokens`` (or
``max_completion_tokens``) can only shorten the run's ``max_tokens``.

Answers are ``chat.completion`` objects, or with ``stream`` the same content as
``chat.completion.chunk`` server-sent events ending with ``data: [DONE]``. Tool calls the model
wrote in its template's form (``<tool_call>`` blocks) come back as OpenAI ``tool_calls`` with
``arguments`` as JSON text and ids ``call_<call>_<i>``; the text outside them is the ``content``.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from telescope_rollout._types import Message
from telescope_rollout.envs._toolcalls import ToolCall, strip_tool_call_blocks
from telescope_rollout.gateway._messages import RequestError, canonical_messages

__all__ = [
    "answer_message",
    "chat_chunks",
    "chat_response",
    "check_sampling",
    "error_body",
    "requested_max_tokens",
]

_REFUSED = {
    "logit_bias": "logit_bias changes the sampling distribution",
    "presence_penalty": "penalties change the sampling distribution",
    "frequency_penalty": "penalties change the sampling distribution",
    "guided_json": "guided decoding changes the sampling distribution",
    "guided_regex": "guided decoding changes the sampling distribution",
    "guided_choice": "guided decoding changes the sampling distribution",
    "structured_outputs": "guided decoding changes the sampling distribution",
}


def check_sampling(body: dict[str, Any]) -> None:
    """Refuse what would make the trained logprobs describe another distribution (module docstring)."""
    n = body.get("n")
    if n not in (None, 1):
        raise RequestError("n must be 1: each call is one turn of one episode", param="n")
    for key, why in _REFUSED.items():
        value = body.get(key)
        if value not in (None, 0, 0.0, {}, [], ""):
            raise RequestError(
                f"{key} is not supported: {why}, and training needs the sampled one", param=key
            )
    fmt: object = body.get("response_format")
    if isinstance(fmt, dict) and cast(dict[str, Any], fmt).get("type", "text") != "text":
        raise RequestError(
            "response_format other than text is not supported: constrained decoding changes the sampling "
            "distribution; ask for the format in the prompt instead",
            param="response_format",
        )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(
            "tool_choice must be auto or none: forcing a call needs constrained decoding, which changes "
            "the sampling distribution",
            param="tool_choice",
        )


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """The request's ``max_completion_tokens`` or ``max_tokens`` (a positive integer), else None."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise RequestError(f"{key} must be a positive integer (got {value!r})", param=key)
        return value
    return None


def answer_message(text: str, parsed: list[ToolCall], *, call: int) -> tuple[dict[str, Any], Message]:
    """The assistant message for a completion ``text`` whose tool calls are ``parsed`` (none when the
    request had no tools or said ``tool_choice: none``): as OpenAI answers it (``arguments`` as JSON
    text) and in canonical form (what the agent must send back to extend the episode). A text whose
    calls are all malformed stays the content as the model wrote it."""
    calls = [c for c in parsed if not c.error and c.name]
    if not calls:
        message: dict[str, Any] = {"role": "assistant", "content": text}
    else:
        message = {
            "role": "assistant",
            "content": strip_tool_call_blocks(text) or None,
            "tool_calls": [
                {
                    "id": f"call_{call}_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for i, c in enumerate(calls)
            ],
        }
    return message, canonical_messages([message])[0]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_response(
    response_id: str, model: str, message: dict[str, Any], finish_reason: str, usage: tuple[int, int]
) -> dict[str, Any]:
    """A ``chat.completion`` object of one choice."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": _usage(*usage),
    }


def chat_chunks(
    response_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage: tuple[int, int] | None,
) -> list[dict[str, Any]]:
    """The same answer as ``chat.completion.chunk`` events: the role, the content, the tool calls
    (each whole, with its ``index``), the finish reason, and with ``usage`` a last chunk holding it."""
    base = {"id": response_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(chunk({"content": message["content"]}))
    calls: list[dict[str, Any]] = message.get("tool_calls") or []
    if calls:
        out.append(chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
    out.append(chunk({}, finish_reason))
    if usage is not None:
        out.append({**base, "choices": [], "usage": _usage(*usage)})
    return out


def error_body(err: RequestError) -> dict[str, Any]:
    """OpenAI's error object for a refused request."""
    kind = "invalid_request_error" if err.status < 500 else "server_error"
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}
