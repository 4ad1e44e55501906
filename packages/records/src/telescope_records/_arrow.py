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
    "ArrowTable",
    "DataType",
    "Field",
    "ListType",
    "MapType",
    "Schema",
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
    "map_",
    "schema",
    "string",
    "table_from_pydict",
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


def table_from_pydict(columns: Mapping[str, Sequence[Any]], *, schema: Schema) -> ArrowTable:
    return _pa.Table.from_pydict(columns, schema=schema)


def write_table(table: ArrowTable, where: str | Path, *, compression: str) -> None:
    _pq.write_table(table, where, compression=compression)
