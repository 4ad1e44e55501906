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

Rows are one way in (:func:`to_arrow`); whole columns are the other (:func:`columns_to_arrow`), for a
table with many list entries a row (the token table: one per token): a :class:`ListColumn` gives a
list column as flat values and row offsets, converted at once, with no Python object per entry.
Its values are stored as the column's type with no marks (numbers as given, text not cut).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import numpy as np

from telescope_records import _arrow as arrow
from telescope_records._schema import Column, Table

__all__ = [
    "MAX_CHARS",
    "REPR_MARK",
    "TRUNCATION_MARK",
    "ListColumn",
    "columns_to_arrow",
    "cut",
    "to_arrow",
    "to_json_text",
]

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


_EXACT_INT = 2**53
"""Integers a float column holds exactly; Arrow refuses to convert a larger one."""


def _plain_text(v: Any, limit: int) -> bool:
    """None, or text within ``limit``."""
    return v is None or (type(v) is str and len(v) <= limit)


def _plain_number(v: Any) -> bool:
    """None, a float, or an integer a float holds exactly."""
    return v is None or type(v) is float or (type(v) is int and -_EXACT_INT <= v <= _EXACT_INT)


def _plain_map(v: Any, plain: Callable[[Any], bool]) -> bool:
    """None, or a dict of text keys to values ``plain`` accepts."""
    if v is None:
        return True
    if type(v) is not dict:
        return False
    return all(type(k) is str and plain(x) for k, x in cast("dict[object, object]", v).items())


def _plain(column: Column, values: list[Any]) -> bool:
    """Whether every value is already what ``column`` stores (None, or of its own Python type; text
    within its limit; a dict of text keys to such values for a map), so that none needs
    :func:`_value`."""
    t, limit = column.type, column.max_chars or MAX_CHARS
    if arrow.is_string(t):
        return all(_plain_text(v, limit) for v in values)
    if arrow.is_integer(t):
        return all(v is None or type(v) is int for v in values)
    if arrow.is_floating(t):
        return all(_plain_number(v) for v in values)
    if arrow.is_boolean(t):
        return all(v is None or type(v) is bool for v in values)
    if arrow.is_map(t) and arrow.is_floating(t.item_type):
        return all(_plain_map(v, _plain_number) for v in values)
    if arrow.is_map(t) and arrow.is_string(t.item_type):
        return all(_plain_map(v, lambda x: _plain_text(x, limit)) for v in values)
    return False


def _column(column: Column, values: list[Any]) -> list[Any]:
    """A column's values coerced as :func:`_value` coerces each; a column of plain values
    (:func:`_plain`, the common case) as it is, without a call a value."""
    return values if _plain(column, values) else [_value(column, v) for v in values]


def to_arrow(table: Table, rows: Iterable[Mapping[str, Any]]) -> arrow.ArrowTable:
    """``rows`` as an Arrow table of ``table``'s schema (see the module docstring), column by column."""
    rows = list(rows)
    names = {c.name for c in table.columns}
    for row in rows:
        if not names.issuperset(row):
            raise ValueError(
                f"record table {table.name!r} has no column(s) {sorted(set(row) - names)}; "
                f"its columns: {sorted(names)}"
            )
    columns = {c.name: _column(c, [row.get(c.name) for row in rows]) for c in table.columns}
    return arrow.table_from_pydict(columns, schema=table.schema())


@dataclass(frozen=True)
class ListColumn:
    """A list column given whole (:func:`columns_to_arrow`): row ``i`` holds
    ``values[offsets[i]:offsets[i + 1]]``, or is null where ``valid[i]`` is False. With ``texts``
    the values are indices into it (a column of text from a small table of texts, e.g. a
    vocabulary's decoded tokens)."""

    offsets: np.ndarray
    """Row boundaries into ``values``: one more than the rows, starting at 0."""
    values: np.ndarray
    valid: np.ndarray | None = None
    texts: Sequence[str] | None = None


def columns_to_arrow(
    table: Table, columns: Mapping[str, Sequence[Any] | ListColumn], rows: int
) -> arrow.ArrowTable:
    """``columns`` (each ``rows`` long; a column left out is null) as an Arrow table of ``table``'s
    schema: a :class:`ListColumn` converted at once, any other column value by value as in
    :func:`to_arrow` (see the module docstring)."""
    names = {c.name for c in table.columns}
    extra = set(columns) - names
    if extra:
        raise ValueError(
            f"record table {table.name!r} has no column(s) {sorted(extra)}; its columns: {sorted(names)}"
        )
    arrays: list[arrow.Array] = []
    for c in table.columns:
        given = columns.get(c.name)
        if isinstance(given, ListColumn):
            arrays.append(_list_column(table, c, given, rows))
            continue
        values = [None] * rows if given is None else _column(c, list(given))
        if len(values) != rows:
            raise ValueError(
                f"record table {table.name!r}: column {c.name} has {len(values)} values, not {rows}"
            )
        arrays.append(arrow.array(values, c.type))
    return arrow.table_from_arrays(arrays, schema=table.schema())


def _list_column(table: Table, column: Column, given: ListColumn, rows: int) -> arrow.Array:
    t, where = column.type, f"record table {table.name!r}: column {column.name}"
    if not arrow.is_list(t):
        raise TypeError(f"{where} is {t}, not a list")
    if len(given.offsets) != rows + 1:
        raise ValueError(f"{where} has {len(given.offsets) - 1} rows, not {rows}")
    if len(given.values) != int(given.offsets[-1]):
        raise ValueError(
            f"{where} has {len(given.values)} values; its offsets end at {int(given.offsets[-1])}"
        )
    if given.valid is not None and len(given.valid) != rows:
        raise ValueError(f"{where} has {len(given.valid)} validity flags, not {rows}")
    values: Any = given.values if given.texts is None else arrow.text_array(given.texts, given.values)
    return arrow.list_array(given.offsets, values, t, valid=given.valid)
