"""Parsing tool calls out of model text, total on any input.

Forms understood:

* ``xml`` (Hermes/Qwen, the default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  and inside the same tags the Qwen3-Coder XML form
  ``<function=name><parameter=x>value</parameter></function>``. A final unclosed tag is accepted
  (servers often stop on ``</tool_call>``).
* ``function``: ``name(arg=1, other="x")`` for known tool names, parsed with ``ast`` (literals only).

Broken calls come back as :class:`ToolCall` with ``error`` set, so the environment can tell the
model what went wrong. Scanning is linear; per-turn call count and per-call size are capped.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import dataclass, field
from typing import Any, cast

MAX_CALLS = 16
MAX_CALL_CHARS = 32_000
_OPEN = re.compile(r"<tool_call\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"</tool_call\s*>", re.IGNORECASE)
_FUNCTION = re.compile(r"<function\s*=\s*([^>\s]+)\s*>(.*?)(?:</function\s*>|\Z)", re.S | re.IGNORECASE)
_PARAM = re.compile(r"<parameter\s*=\s*([^>\s]+)\s*>\n?(.*?)\n?</parameter\s*>", re.S | re.IGNORECASE)


@dataclass
class ToolCall:
    """One parsed call; ``error`` is set when the text could not be understood."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict[str, Any])
    raw: str = ""
    error: str | None = None


def _from_json(body: str) -> ToolCall:
    try:
        loaded: object = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return ToolCall("", raw=body, error=f"invalid JSON in tool call: {exc}")
    obj = cast(dict[str, Any], loaded) if isinstance(loaded, dict) else None
    name: object = obj.get("name") if obj is not None else None
    if obj is None or not isinstance(name, str):
        return ToolCall(
            "", raw=body, error='a tool call must be a JSON object {"name": ..., "arguments": {...}}'
        )
    args: object = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return ToolCall(name, raw=body, error="`arguments` is a string that is not JSON")
    if not isinstance(args, dict):
        return ToolCall(name, raw=body, error="`arguments` must be a JSON object")
    return ToolCall(name, cast(dict[str, Any], args), raw=body)


def _param_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def _from_xml(body: str) -> ToolCall:
    m = _FUNCTION.search(body)
    if m is None:
        return ToolCall("", raw=body, error="could not find <function=NAME> in tool call")
    args = {p.group(1): _param_value(p.group(2)) for p in _PARAM.finditer(m.group(2))}
    return ToolCall(m.group(1), args, raw=body)


def _parse_body(body: str) -> ToolCall:
    if len(body) > MAX_CALL_CHARS:
        return ToolCall("", raw=body[:200], error=f"tool call longer than {MAX_CALL_CHARS} characters")
    stripped = body.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    if re.match(r"<function\s*=", stripped, re.IGNORECASE):
        return _from_xml(stripped)
    return _from_json(stripped)


def parse_xml_tool_calls(text: str, max_calls: int = MAX_CALLS) -> list[ToolCall]:
    """Calls in ``<tool_call>...</tool_call>`` tags (JSON or XML body)."""
    closes = [m.start() for m in _CLOSE.finditer(text)]
    close_ends = {m.start(): m.end() for m in _CLOSE.finditer(text)}
    calls: list[ToolCall] = []
    pos = 0
    for m in _OPEN.finditer(text):
        if m.start() < pos:
            continue
        k = bisect.bisect_left(closes, m.end())
        if k < len(closes):
            body, pos = text[m.end() : closes[k]], close_ends[closes[k]]
        else:
            body, pos = text[m.end() :], len(text)
            if not body.strip():
                break
        calls.append(_parse_body(body))
        if len(calls) >= max_calls:
            break
    return calls


def _call_span(text: str, start: int) -> int | None:
    """Index just past the parenthesis closing the one at ``start`` (quote-aware), or None."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            q = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            end = text.find(q, i + len(q))
            while end > 0 and len(q) == 1 and text[end - 1] == "\\":
                end = text.find(q, end + 1)
            if end < 0:
                return None
            i = end + len(q)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def parse_function_tool_calls(text: str, tool_names: list[str], max_calls: int = MAX_CALLS) -> list[ToolCall]:
    """Calls written as Python ``name(a=1, "x")`` for known tool names; positional args keyed "0", "1", ..."""
    if not tool_names:
        return []
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in tool_names) + r")\s*\(")
    calls: list[ToolCall] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() < pos:
            continue
        end = _call_span(text, m.end() - 1)
        if end is None:
            break
        raw, pos = text[m.start() : end], end
        calls.append(_from_python(m.group(1), raw))
        if len(calls) >= max_calls:
            break
    return calls


def _from_python(name: str, raw: str) -> ToolCall:
    if len(raw) > MAX_CALL_CHARS:
        return ToolCall(name, raw=raw[:200], error=f"tool call longer than {MAX_CALL_CHARS} characters")
    try:
        node = ast.parse(raw.strip(), mode="eval").body
        if not isinstance(node, ast.Call):
            raise ValueError("not a call")
        args = {str(i): ast.literal_eval(a) for i, a in enumerate(node.args)}
        args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg})
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        return ToolCall(name, raw=raw, error=f"could not parse the call (literal arguments only): {exc}")
    return ToolCall(name, args, raw=raw)


def strip_tool_call_blocks(text: str) -> str:
    """``text`` without its ``<tool_call>...</tool_call>`` blocks (an unclosed final one included)."""
    out: list[str] = []
    pos = 0
    for m in _OPEN.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        close = _CLOSE.search(text, m.end())
        pos = close.end() if close else len(text)
    out.append(text[pos:])
    return "".join(out).strip()


def parse_tool_calls(
    text: str, tool_call_format: str = "xml", tool_names: list[str] | None = None
) -> list[ToolCall]:
    """Dispatch on the format; unknown formats fall back to ``xml``."""
    if tool_call_format == "function":
        return parse_function_tool_calls(text, tool_names or [])
    return parse_xml_tool_calls(text)
