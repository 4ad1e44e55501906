"""OpenAI-style tool schemas from typed Python functions with docstrings.

Type hints map to JSON types (str→string, int→integer, float→number, bool→boolean,
list[X]→array, dict→object, Literal→enum, X | None→X; anything else→string); parameters without
defaults are required; the docstring's first paragraph is the description and a Google-style
``Args:`` section (or ``:param x:`` lines) describes the parameters.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, cast

_SIMPLE: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


def json_type(hint: Any) -> dict[str, Any]:
    """The JSON-schema fragment for one type hint."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return json_type(rest[0]) if len(rest) == 1 else {"type": "string"}
    if origin is typing.Literal:
        first: object = args[0]
        return {"type": _SIMPLE.get(type(first), "string"), "enum": list(args)}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", "items": json_type(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object"}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    return {"type": "string"}


def _param_docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(r":param\s+(\w+):\s*(.+)", doc):
        out[m.group(1)] = m.group(2).strip()
    section = re.search(
        r"(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\s*\n|\n\s*(?:Returns|Raises):|\Z)", doc, re.S
    )
    if section:
        for m in re.finditer(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$", section.group(1), re.M):
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def func_to_tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {name, description, parameters}}`` for ``func``."""
    doc = inspect.getdoc(func) or ""
    description = doc.split("\n\n", 1)[0].strip()
    pdocs = _param_docs(doc)
    try:
        hints = typing.get_type_hints(func)
    except Exception:
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, p in inspect.signature(func).parameters.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or name in (
            "self",
            "state",
        ):
            continue
        prop = json_type(hints.get(name, str))
        if name in pdocs:
            prop["description"] = pdocs[name]
        properties[name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def coerce_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Check names and convert obvious string forms (``"3"`` for an integer); raise ValueError otherwise."""
    params = schema["function"]["parameters"]
    props: dict[str, Any] = params["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown}; expected {sorted(props)}")
    missing = [r for r in params["required"] if r not in arguments]
    if missing:
        raise ValueError(f"missing required argument(s) {missing}")
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        out[key] = _coerce(key, props[key].get("type"), value)
    return out


_NO = object()
"""What a converter returns for a value it cannot convert."""


def _to_integer(value: Any) -> Any:
    if isinstance(value, bool):
        return _NO
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value):
        return int(value)
    return _NO


def _to_number(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return _NO
    return _NO


def _to_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return _NO


_CONVERT: dict[str | None, Callable[[Any], Any]] = {
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "string": lambda v: v if isinstance(v, str) else str(v),
    "array": lambda v: list(cast(Sequence[Any], v)) if isinstance(v, list | tuple) else _NO,
    "object": lambda v: cast(dict[str, Any], v) if isinstance(v, dict) else _NO,
    None: lambda v: v,
}
"""JSON-schema type -> converter of the obvious forms (``"3"`` for an integer); others convert nothing."""


def _coerce(key: str, typ: str | None, value: Any) -> Any:
    convert = _CONVERT.get(typ)
    out = convert(value) if convert is not None else _NO
    if out is _NO:
        raise ValueError(f"argument {key!r} must be {typ}, got {type(value).__name__}")
    return out
