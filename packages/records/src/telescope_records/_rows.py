"""Rows in, an Arrow table of the record's schema out: missing columns are null, values are
coerced to the column's type, over-long text is cut and marked, and what cannot be stored is
recorded as text instead of failing the run.

Marks (documented in docs/records.md, "Bad values"):

* a string longer than its column keeps (``Column.max_chars``, default :data:`MAX_CHARS`) is cut
  and ends with :data:`TRUNCATION_MARK` followed by the number of characters dropped and ``]``;
* a value a text column gets that is not a string (an environment's ``info`` holding objects) is
  stored as JSON, and what JSON cannot hold as its ``repr``, prefixed with :data:`REPR_MARK`;
* a number that is not a number (``"abc"`` for a float column) is null.

A column the table does not have is a programming error (``ValueError`` naming it), because the
writer would silently lose it otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard, cast

import numpy as np

from telescope_records import _arrow as arrow
from telescope_records._schema import Column, Table

__all__ = ["MAX_CHARS", "REPR_MARK", "TRUNCATION_MARK", "cut", "to_arrow", "to_json_text"]

MAX_CHARS = 200_000
"""The longest string a column keeps unless it says otherwise."""
TRUNCATION_MARK = "…[truncated "
REPR_MARK = "[repr] "


def cut(text: str, max_chars: int) -> str:
    """``text`` itself, or its first characters plus the truncation mark (the result is at most
    ``max_chars`` + the mark's length long)."""
    if len(text) <= max_chars:
        return text
    dropped = len(text) - max_chars
    return f"{text[:max_chars]}{TRUNCATION_MARK}{dropped} chars]"


def _is_mapping(value: object) -> TypeGuard[Mapping[object, object]]:
    """Whether ``value`` is a mapping (of anything: rows come from environments' code)."""
    return isinstance(value, Mapping)


def _jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold (objects, NaN, infinities) replaced by a marked repr."""
    if _is_mapping(value):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in cast("list[object] | tuple[object, ...]", value)]
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return REPR_MARK + repr(value)


def to_json_text(value: Any) -> str:
    """``value`` as JSON; parts JSON cannot hold are written as their repr (marked)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(_jsonable(value), ensure_ascii=False)


def _text(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        value = to_json_text(value)
    return cut(value, limit)


def _number(value: Any, kind: type) -> Any:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(number, float) and not math.isfinite(number):
        return None if kind is int else number
    return number


def _float_map(value: Any) -> list[tuple[str, float | None]] | None:
    if value is None:
        return None
    if not _is_mapping(value):
        return [(REPR_MARK + repr(value)[:200], None)]
    return [(str(k), _number(v, float)) for k, v in value.items()]


def _text_map(value: Any, limit: int) -> list[tuple[str, str | None]] | None:
    if value is None:
        return None
    if not _is_mapping(value):
        return [(REPR_MARK + repr(value)[:200], None)]
    return [(str(k), _text(v, limit)) for k, v in value.items()]


def _number_list(value: Any, item: arrow.DataType) -> Any:
    """A list column's value: None, or the numbers as a NumPy array of the item type (NaN kept in
    float lists; integers must be whole)."""
    if value is None:
        return None
    dtype = np.float32 if arrow.is_floating(item) else np.int32
    try:
        return np.asarray(value, dtype=dtype).reshape(-1)
    except (TypeError, ValueError):
        return None


def _value(column: Column, value: Any) -> Any:
    """``value`` coerced to ``column``'s type (see the module docstring)."""
    limit = column.max_chars or MAX_CHARS
    t = column.type
    if arrow.is_string(t):
        return _text(value, limit)
    if arrow.is_integer(t):
        return _number(value, int)
    if arrow.is_floating(t):
        return _number(value, float)
    if arrow.is_boolean(t):
        return None if value is None else bool(value)
    if arrow.is_map(t) and arrow.is_floating(t.item_type):
        return _float_map(value)
    if arrow.is_map(t):
        return _text_map(value, limit)
    if arrow.is_list(t) and arrow.is_string(t.value_type):
        return None if value is None else [cut(str(v), limit) for v in value]
    if arrow.is_list(t):
        return _number_list(value, t.value_type)
    raise TypeError(f"column {column.name}: no coercion for type {t}")  # a schema without a rule


def to_arrow(table: Table, rows: Iterable[Mapping[str, Any]]) -> arrow.ArrowTable:
    """``rows`` as an Arrow table of ``table``'s schema (see the module docstring)."""
    names = {c.name for c in table.columns}
    columns: dict[str, list[Any]] = {c.name: [] for c in table.columns}
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(
                f"record table {table.name!r} has no column(s) {sorted(extra)}; its columns: {sorted(names)}"
            )
        for c in table.columns:
            columns[c.name].append(_value(c, row.get(c.name)))
    return arrow.table_from_pydict(columns, schema=table.schema())
