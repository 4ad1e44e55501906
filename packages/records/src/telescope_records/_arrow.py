"""The parts of pyarrow the record uses, with their types.

pyarrow ships no type information (its classes live in a compiled module), so a type checker sees
every pyarrow name as unknown. This module is where the record meets pyarrow: the objects it uses
are described as protocols, and the functions that make or take them are pyarrow's own, given
their types here, so the rest of the package is checked. At run time nothing is wrapped: each
name below is the pyarrow function itself, or a one-line call of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeGuard

import pyarrow
import pyarrow.parquet
import pyarrow.types

__all__ = [
    "Array",
    "ArrowTable",
    "DataType",
    "Field",
    "ListType",
    "MapType",
    "Schema",
    "array",
    "bool_",
    "field",
    "float32",
    "float64",
    "int32",
    "int64",
    "is_boolean",
    "is_floating",
    "is_integer",
    "is_list",
    "is_map",
    "is_string",
    "list_",
    "list_array",
    "map_",
    "schema",
    "string",
    "table_from_arrays",
    "table_from_pydict",
    "text_array",
    "text_paths",
    "write_table",
]

_pa: Any = pyarrow
_types: Any = pyarrow.types
_pq: Any = pyarrow.parquet


class DataType(Protocol):
    """An Arrow type (``pyarrow.DataType``)."""

    @property
    def id(self) -> int: ...


class MapType(DataType, Protocol):
    """A map type (``pyarrow.MapType``)."""

    @property
    def key_type(self) -> DataType: ...

    @property
    def item_type(self) -> DataType: ...


class ListType(DataType, Protocol):
    """A list type (``pyarrow.ListType``)."""

    @property
    def value_type(self) -> DataType: ...


class Field(Protocol):
    """A column of a schema (``pyarrow.Field``)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> DataType: ...


class Schema(Protocol):
    """The columns of a table (``pyarrow.Schema``): its fields, in order."""

    def __iter__(self) -> Iterator[Field]: ...

    def empty_table(self) -> ArrowTable: ...


class ArrowTable(Protocol):
    """Columns of equal length (``pyarrow.Table``)."""

    @property
    def schema(self) -> Schema: ...

    @property
    def num_rows(self) -> int: ...

    def to_pylist(self) -> list[dict[str, Any]]: ...


class Array(Protocol):
    """A column's values (``pyarrow.Array``)."""

    @property
    def type(self) -> DataType: ...

    def __len__(self) -> int: ...


string: Callable[[], DataType] = _pa.string
int32: Callable[[], DataType] = _pa.int32
int64: Callable[[], DataType] = _pa.int64
float32: Callable[[], DataType] = _pa.float32
float64: Callable[[], DataType] = _pa.float64
bool_: Callable[[], DataType] = _pa.bool_
map_: Callable[[DataType, DataType], MapType] = _pa.map_
list_: Callable[[DataType], ListType] = _pa.list_

is_string: Callable[[DataType], bool] = _types.is_string
is_integer: Callable[[DataType], bool] = _types.is_integer
is_floating: Callable[[DataType], bool] = _types.is_floating
is_boolean: Callable[[DataType], bool] = _types.is_boolean
is_map: Callable[[DataType], TypeGuard[MapType]] = _types.is_map
is_list: Callable[[DataType], TypeGuard[ListType]] = _types.is_list


def field(name: str, type_: DataType, *, nullable: bool) -> Field:
    return _pa.field(name, type_, nullable=nullable)


def schema(fields: Sequence[Field]) -> Schema:
    return _pa.schema(fields)


def array(values: Sequence[Any], type_: DataType) -> Array:
    """``values`` (Python objects, coerced already) as an array of ``type_``."""
    return _pa.array(values, type_)


def list_array(offsets: Any, values: Any, type_: ListType, *, valid: Any = None) -> Array:
    """A list array of ``type_``: row i holds ``values[offsets[i]:offsets[i + 1]]`` (NumPy or Arrow
    values; ``offsets`` int32, one more than the rows); ``valid``: False where a row is null."""
    mask = None if valid is None else _pa.array(~valid)
    flat = values if isinstance(values, _pa.Array) else _pa.array(values)
    return _pa.ListArray.from_arrays(_pa.array(offsets, _pa.int32()), flat.cast(type_.value_type), mask=mask)


def text_array(texts: Sequence[str], codes: Any) -> Array:
    """``texts[codes[i]]`` for each code (an int array): one conversion of ``texts``, a take."""
    return _pa.array(texts, _pa.string()).take(_pa.array(codes))


def table_from_arrays(arrays: Sequence[Any], *, schema: Schema) -> ArrowTable:
    return _pa.Table.from_arrays(list(arrays), schema=schema)


def table_from_pydict(columns: Mapping[str, Sequence[Any]], *, schema: Schema) -> ArrowTable:
    return _pa.Table.from_pydict(columns, schema=schema)


def text_paths(schema: Schema) -> list[str]:
    """The Parquet paths of ``schema``'s text values: text columns, the items of lists of text, the
    keys and values of maps of text."""
    out: list[str] = []
    for f in schema:
        t = f.type
        if is_string(t):
            out.append(f.name)
        elif is_list(t) and is_string(t.value_type):
            out.append(f"{f.name}.list.element")
        elif is_map(t):
            parts = (("key", t.key_type), ("value", t.item_type))
            out += [f"{f.name}.key_value.{part}" for part, v in parts if is_string(v)]
    return out


def write_table(table: ArrowTable, where: str | Path, *, compression: str) -> None:
    """``table`` as a Parquet file; only its text is dictionary-encoded (numbers gain little by it,
    and trying it on the token table's millions of floats was 40% of its write)."""
    _pq.write_table(table, where, compression=compression, use_dictionary=text_paths(table.schema))
