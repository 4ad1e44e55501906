"""OpenAI chat messages and tools as the agent gateway compares and renders them.

An agent sends its whole conversation on every call, re-serialised by its client: ``content`` as
a string, ``null`` or a list of text parts, tool-call ``arguments`` as JSON text, and fields its
SDK echoes back (``refusal``, ``annotations``, ``audio``, ...). :func:`canonical_messages` turns
that into one form, so that two serialisations of the same conversation compare equal (the
prefix rule, docs/rollout.md "Agents"): ``role``; ``content`` as text; ``tool_calls`` with
``arguments`` parsed (kept as text when they are not JSON); ``tool_call_id`` and ``name`` where
given; everything else dropped. The same form is what the chat template renders (templates want
``arguments`` as a mapping). Anything that cannot be rendered faithfully is a
:class:`RequestError` naming the field and the fix.
"""

from __future__ import annotations

import json
from typing import Any, cast

from telescope_rollout._types import Message

__all__ = ["ROLES", "RequestError", "canonical_messages", "canonical_tools", "tools_key"]

ROLES = ("system", "user", "assistant", "tool")
"""The roles a conversation may hold (``developer``, OpenAI's newer name for system, is read as system)."""
MAX_TOOLS = 128
MAX_NAME_CHARS = 100


class RequestError(Exception):
    """A request the gateway refuses: HTTP ``status``, OpenAI's error ``code`` and ``param``."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request", status: int = 400
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def _as_dict(value: object) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _content(value: object, where: str) -> str:
    """``content`` as text: a string, ``null`` (""), or text parts joined; other parts are refused."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts: list[str] = []
        for j, part in enumerate(cast(list[object], value)):
            entry = _as_dict(part)
            if entry is None or entry.get("type", "text") != "text" or not isinstance(entry.get("text"), str):
                kind = entry.get("type") if entry is not None else type(part).__name__
                raise RequestError(
                    f"{where}.content[{j}] is a {kind!r} part: only text content is supported "
                    "(send the text, or describe the image in words)",
                    param=f"{where}.content",
                )
            texts.append(str(entry["text"]))
        return "".join(texts)
    raise RequestError(
        f"{where}.content must be a string, null or a list of text parts", param=f"{where}.content"
    )


def _arguments(value: object) -> Any:
    """Tool-call arguments: JSON text parsed (text that is not JSON stays text), a mapping as is."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except (ValueError, RecursionError):
            return value
    return value if value is not None else {}


def _tool_call(value: object, where: str) -> dict[str, Any]:
    entry = _as_dict(value)
    fn = _as_dict(entry.get("function")) if entry is not None else None
    name = fn.get("name") if fn is not None else None
    if entry is None or fn is None or not isinstance(name, str) or not name:
        raise RequestError(
            f'{where} must be {{"id": ..., "type": "function", '
            '"function": {"name": ..., "arguments": ...}}',
            param=where,
        )
    return {
        "id": str(entry.get("id") or ""),
        "type": "function",
        "function": {"name": name, "arguments": _arguments(fn.get("arguments"))},
    }


def _message(value: object, i: int) -> Message:
    where = f"messages[{i}]"
    raw = _as_dict(value)
    if raw is None:
        raise RequestError(f"{where} must be an object with a role and content", param=where)
    role = "system" if raw.get("role") == "developer" else raw.get("role")
    if role not in ROLES:
        raise RequestError(
            f"{where}.role must be one of {', '.join(ROLES)} (got {raw.get('role')!r})", param=f"{where}.role"
        )
    out: Message = {"role": role, "content": _content(raw.get("content"), where)}
    calls = raw.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
        out["tool_calls"] = [
            _tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(cast(list[object], calls))
        ]
    if role == "tool" and raw.get("tool_call_id") is not None:
        out["tool_call_id"] = str(raw["tool_call_id"])
    if isinstance(raw.get("name"), str):
        out["name"] = raw["name"]
    return out


def canonical_messages(value: object) -> list[Message]:
    """A request's ``messages`` in the canonical form (module docstring); bad ones: RequestError."""
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list", param="messages")
    return [_message(m, i) for i, m in enumerate(cast(list[object], value))]


def canonical_tools(value: object) -> list[dict[str, Any]] | None:
    """A request's ``tools`` (OpenAI function tools) checked; None for none. Bad ones: RequestError."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise RequestError("tools must be a list of function tools", param="tools")
    items = cast(list[object], value)
    if len(items) > MAX_TOOLS:
        raise RequestError(f"{len(items)} tools: at most {MAX_TOOLS} are accepted", param="tools")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        entry = _as_dict(item)
        fn = _as_dict(entry.get("function")) if entry is not None else None
        name = fn.get("name") if fn is not None else None
        if (
            entry is None
            or entry.get("type", "function") != "function"
            or fn is None
            or not isinstance(name, str)
        ):
            raise RequestError(
                f'tools[{i}] must be {{"type": "function", '
                '"function": {"name": ..., "parameters": {...}}}',
                param=f"tools[{i}]",
            )
        if not name or len(name) > MAX_NAME_CHARS:
            raise RequestError(
                f"tools[{i}].function.name must be 1 to {MAX_NAME_CHARS} characters", param=f"tools[{i}]"
            )
        function = {k: fn[k] for k in ("name", "description", "parameters", "strict") if k in fn}
        out.append({"type": "function", "function": function})
    return out


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """One string per distinct tool list: a change of tools re-renders the whole prompt."""
    return json.dumps(tools or [], sort_keys=True, ensure_ascii=False, default=str)
