"""The record of a Telescope run: versioned Parquet tables under ``RUN_DIR/records/``.

The format (tables, columns, units, files) is documented in docs/records.md; :data:`TABLES` is
the same in code. ``telescope train`` writes it with :class:`RecordWriter`; :func:`connect`
(extra ``query``) reads a run, or a folder of runs, with DuckDB.
"""

from telescope_records.__about__ import __version__
from telescope_records._query import connect, table_glob
from telescope_records._rows import (
    MAX_CHARS,
    REPR_MARK,
    TRUNCATION_MARK,
    ListColumn,
    columns_to_arrow,
    cut,
    to_arrow,
    to_json_text,
)
from telescope_records._schema import FORMAT_VERSION, TABLES, Column, Table, table
from telescope_records._writer import RecordError, RecordWriter, read_manifest, records_dir

__all__ = [
    "__version__",
    # the format
    "FORMAT_VERSION", "TABLES", "Column", "Table", "table",
    # writing
    "RecordError", "RecordWriter", "read_manifest", "records_dir",
    # rows and their marks
    "MAX_CHARS", "REPR_MARK", "TRUNCATION_MARK", "cut", "to_arrow", "to_json_text",
    # whole columns
    "ListColumn", "columns_to_arrow",
    # reading (DuckDB)
    "connect", "table_glob",
]  # fmt: skip
