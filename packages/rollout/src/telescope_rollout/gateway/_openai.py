"""OpenAI's request rules and response shapes, as the agent gateway speaks them.

What changes the sampling distribution is refused with the reason (the trained logprobs would no
longer describe it): ``n`` other than 1, ``logit_bias``, ``response_format`` other than text,
penalties, guided decoding, a forced ``tool_choice``. ``temperature``, ``top_p`` and ``seed`` are
the run's (the config's sampling settings), whatever the request says. ``max_tokens`` (or
``max_completion_tokens``) can only shorten the run's ``max_tokens``.

Answers are ``chat.completion`` objects (``/completions``: ``text_completion``), or with ``stream``
the same content as ``chat.completion.chunk`` (``text_completion``) server-sent events ending with
``data: [DONE]``; ``return_token_ids`` (vLLM's name) adds the prompt's and the answer's token ids.
``/completions`` takes one ``prompt``: token ids (used as they are) or text. Tool calls the model
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
    "chat_response",
    "check_sampling",
    "completion_prompt",
    "completion_response",
    "error_body",
    "requested_max_tokens",
    "stream_chunks",
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
    response_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage: tuple[int, int],
    token_ids: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` object of one choice; with ``token_ids`` (the request asked
    ``return_token_ids``, vLLM's name) the prompt's and the answer's ids too."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    out = _envelope(response_id, "chat.completion", model, choice, usage)
    if token_ids is not None:
        out["prompt_token_ids"], choice["token_ids"] = token_ids
    return out


def completion_response(
    response_id: str,
    model: str,
    text: str,
    finish_reason: str,
    usage: tuple[int, int],
    token_ids: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object of one choice (``token_ids`` as in :func:`chat_response`)."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    out = _envelope(response_id, "text_completion", model, choice, usage)
    if token_ids is not None:
        choice["prompt_token_ids"], choice["token_ids"] = token_ids
    return out


def _envelope(
    response_id: str, kind: str, model: str, choice: dict[str, Any], usage: tuple[int, int]
) -> dict[str, Any]:
    """The fields every answer object shares around its one ``choice``."""
    return {
        "id": response_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(*usage),
    }


def completion_prompt(body: dict[str, Any]) -> list[int] | str:
    """A ``/completions`` request's ``prompt``: token ids or text (one prompt: ``n`` is 1)."""
    prompt: object = body.get("prompt")
    if isinstance(prompt, list):
        items = cast(list[object], prompt)
        if len(items) == 1 and isinstance(items[0], str | list):
            prompt = cast(object, items[0])  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list):
        ids = cast(list[object], prompt)
        if ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            return cast(list[int], ids)
    raise RequestError(
        "prompt must be one non-empty text or one non-empty list of token ids (a batch of prompts is "
        "not supported: each call is one turn of one episode)",
        param="prompt",
    )


def stream_chunks(whole: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A whole ``chat.completion`` or ``text_completion`` as the chunks a stream sends: for chat the
    role, the content, the tool calls (each whole, with its ``index``) and the finish reason; for a
    completion the text and the finish reason; with ``include_usage`` a last chunk holding it."""
    chat = whole["object"] == "chat.completion"
    base = {
        "id": whole["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": whole["created"],
        "model": whole["model"],
    }
    choice: dict[str, Any] = whole["choices"][0]
    finish: str = choice["finish_reason"]

    def chunk(part: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, **part, "logprobs": None, "finish_reason": finish_reason}]}

    if chat:
        message: dict[str, Any] = choice["message"]
        out = [chunk({"delta": {"role": "assistant", "content": ""}})]
        if message.get("content"):
            out.append(chunk({"delta": {"content": message["content"]}}))
        calls: list[dict[str, Any]] = message.get("tool_calls") or []
        if calls:
            out.append(chunk({"delta": {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}}))
        out.append(chunk({"delta": {}}, finish))
    else:
        out = [chunk({"text": choice["text"]}), chunk({"text": ""}, finish)]
    if include_usage:
        out.append({**base, "choices": [], "usage": whole["usage"]})
    return out


def error_body(err: RequestError) -> dict[str, Any]:
    """OpenAI's error object for a refused request."""
    kind = "invalid_request_error" if err.status < 500 else "server_error"
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}
