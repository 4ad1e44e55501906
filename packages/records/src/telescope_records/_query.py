"""Reading records with DuckDB: one view per table over one glob of Parquet files.

``connect(path)`` takes a run directory (it has ``records/``) or a folder of run directories
(``runs/``) and returns an in-memory DuckDB connection with a view per table of the record
(``samples``, ``turns``, ...) and ``metrics`` over ``metrics.jsonl``; every view has a ``run``
column (the run directory's name). A table no file holds yet is an empty view of its schema, so
queries work on a run that has just started. Nothing is copied: the views read the files when
queried, so a live run's new files show up in the next query.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope_records._schema import TABLES

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["connect", "table_glob"]

_RUN_OF_FILE = r"regexp_extract(filename, '([^/]+)/records/[^/]+/[^/]+$', 1)"


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as exc:
        raise ImportError(
            'reading records needs DuckDB: pip install "telescope-records[query]" (or duckdb)'
        ) from exc
    return duckdb


def _runs_glob(path: Path) -> str:
    """``path`` itself when it is a run directory, else ``path/*`` (a folder of runs)."""
    return str(path) if (path / "records").is_dir() else str(path / "*")


def table_glob(path: str | Path, table_name: str) -> str:
    """The glob of one table's files under a run directory or a folder of runs."""
    if table_name not in TABLES:
        raise KeyError(f"unknown record table {table_name!r}; the tables are: {', '.join(TABLES)}")
    return f"{_runs_glob(Path(path))}/records/{table_name}/*.parquet"


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(path: str | Path, *, database: str = ":memory:") -> DuckDBPyConnection:
    """A DuckDB connection with a view per record table over ``path`` (see the module docstring)."""
    duckdb = _duckdb()
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: pass a run directory or a folder of runs")
    con: DuckDBPyConnection = duckdb.connect(database)
    for name, t in TABLES.items():
        glob = table_glob(root, name)
        if any(Path(root).glob(str(Path(glob).relative_to(root)))):
            con.execute(
                f"create view {name} as select * exclude (filename), {_RUN_OF_FILE} as run "
                f"from read_parquet({_sql_text(glob)}, union_by_name = true, filename = true)"
            )
        else:
            con.register(f"_empty_{name}", t.schema().empty_table())
            con.execute(f"create view {name} as select *, ''::varchar as run from _empty_{name}")
    _metrics_view(con, root)
    return con


def _metrics_view(con: DuckDBPyConnection, root: Path) -> None:
    glob = f"{_runs_glob(root)}/metrics.jsonl"
    if any(root.glob(str(Path(glob).relative_to(root)))):
        con.execute(
            "create view metrics as select * exclude (filename), "
            "regexp_extract(filename, '([^/]+)/metrics.jsonl$', 1) as run "
            f"from read_json_auto({_sql_text(glob)}, format = 'newline_delimited', union_by_name = true, "
            "filename = true)"
        )
    else:
        con.execute("create view metrics as select 0::bigint as step, ''::varchar as run where false")
