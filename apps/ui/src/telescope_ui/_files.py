"""The record's files: those of one step, and the time range each file covers.

A table's files are named by step, attempt or flush (docs/records.md, "Files, versions,
attempts"). :func:`step_files` lists those of one step; :class:`TimeIndex` knows the time range of
every file from its Parquet column statistics (no row is read), cached per file by size and
modification time, so a window of the timeline reads only the files that overlap it. It also
keeps small per-file facts (:meth:`TimeIndex.facts`), computed once per file, for views of a
whole long run that would otherwise read every row of every file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow.parquet

__all__ = ["TimeIndex", "step_files"]

_T = TypeVar("_T")

_pq: Any = pyarrow.parquet
"""pyarrow ships no type information: it is reached through this name, and what this module reads
from it is typed by the protocols below."""


class _Statistics(Protocol):
    """A column chunk's statistics (``pyarrow.parquet.Statistics``); min and max are the column's type."""

    @property
    def has_min_max(self) -> bool: ...

    @property
    def min(self) -> Any: ...

    @property
    def max(self) -> Any: ...


class _ColumnChunk(Protocol):
    """One column of a row group (``pyarrow.parquet.ColumnChunkMetaData``)."""

    @property
    def statistics(self) -> _Statistics | None: ...


class _RowGroup(Protocol):
    """A row group's footer entry (``pyarrow.parquet.RowGroupMetaData``)."""

    def column(self, i: int) -> _ColumnChunk: ...


class _ColumnSchema(Protocol):
    """A column of a Parquet schema (``pyarrow.parquet.ColumnSchema``)."""

    @property
    def name(self) -> str: ...


class _ParquetSchema(Protocol):
    """A Parquet file's columns (``pyarrow.parquet.ParquetSchema``)."""

    def column(self, i: int) -> _ColumnSchema: ...


class _FileMetaData(Protocol):
    """A Parquet file's footer (``pyarrow.parquet.FileMetaData``)."""

    @property
    def schema(self) -> _ParquetSchema: ...

    @property
    def num_columns(self) -> int: ...

    @property
    def num_row_groups(self) -> int: ...

    def row_group(self, i: int) -> _RowGroup: ...


def _metadata(path: str) -> _FileMetaData:
    return _pq.ParquetFile(path).metadata


def _read_column(path: str, column: str) -> list[Any]:
    """The values of one column of a Parquet file."""
    return _pq.read_table(path, columns=[column]).column(column).to_pylist()


def _read_rows(path: str, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of a Parquet file, with the given columns."""
    return _pq.read_table(path, columns=columns).to_pylist()


_TIME_COLUMNS = {
    "rollout_events": ("started_at", "ended_at", None),
    "trainer_spans": ("started_at", "ended_at", None),
    "orchestrator_events": ("time", "time", "duration_s"),
    "infra": ("time", "time", None),
}


def _parquet(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(folder) if e.name.endswith(".parquet") and not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def step_files(run: Path, table: str, step: int | None) -> list[str]:
    """The files of ``table`` for ``step`` (every tag), or all its files when ``step`` is None."""
    entries = _parquet(run / "records" / table)
    if step is None:
        return sorted(e.path for e in entries)
    exact, prefix = f"step_{step:06d}.parquet", f"step_{step:06d}-"
    return sorted(e.path for e in entries if e.name == exact or e.name.startswith(prefix))


def _earliest_real(path: str, column: str) -> float:
    """The earliest time above 0 in ``column`` (inf when none): read when the statistics say 0,
    which only records of earlier versions hold (a row at 0.0 for a phase that never
    happened, see ``_queries.HAPPENED``)."""
    values = _read_column(path, column)
    return min((float(v) for v in values if v is not None and v > 0), default=float("inf"))


def _latest_end(path: str, time: str, duration: str) -> float:
    """The latest ``time + duration`` of a file (a missing duration counts as 0): the statistics'
    latest time plus their longest duration would end the window after the run did."""
    rows = _read_rows(path, [time, duration])
    ends = (r[time] + (r[duration] or 0.0) for r in rows if r[time] is not None)
    return max((float(e) for e in ends), default=float("-inf"))


def _range(path: str, table: str) -> tuple[float, float] | None:
    """(earliest start, latest end) of a file from its statistics; None when it has no rows.

    Times of 0 or below are not times (an old record's never-happened rows): the earliest start
    is then read from the column itself, above 0. A table with durations has its latest end read
    from its rows."""
    first, last, duration = _TIME_COLUMNS[table]
    meta = _metadata(path)
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    lo, hi, extra = float("inf"), float("-inf"), 0.0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for name, pick in ((first, "min"), (last, "max"), (duration, "dur")):
            if name is None or name not in names:
                continue
            stats = group.column(names.index(name)).statistics
            if stats is None or not stats.has_min_max:
                continue
            if pick == "min":
                lo = min(lo, float(stats.min))
            elif pick == "max":
                hi = max(hi, float(stats.max))
            else:
                extra = max(extra, float(stats.max))
    if lo <= 0 < hi:
        lo = _earliest_real(path, first)
    if duration is not None and extra > 0:
        hi = max(hi, _latest_end(path, first, duration))
    return (lo, hi) if 0 < lo <= hi else None


class TimeIndex:
    """The time range of each file of the time-bearing tables, cached by (size, mtime)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int], tuple[float, float] | None]] = {}
        self._facts: dict[tuple[str, str], tuple[tuple[int, int], Any]] = {}
        self._lock = threading.Lock()

    def facts(
        self, files: list[str], kind: str, compute: Callable[[list[str]], dict[str, _T]]
    ) -> dict[str, _T | None]:
        """``{file: fact}`` for ``files``, where ``compute(missing_files)`` gives the facts of the
        files not seen yet (or changed since); cached per (file, kind) by size and mtime."""
        keys: dict[str, tuple[int, int]] = {}
        for path in files:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            keys[path] = (st.st_size, st.st_mtime_ns)
        with self._lock:
            known = {p: self._facts.get((p, kind)) for p in keys}
        missing = [p for p, hit in known.items() if hit is None or hit[0] != keys[p]]
        fresh = compute(missing) if missing else {}
        with self._lock:
            for path in missing:
                self._facts[(path, kind)] = (keys[path], fresh.get(path))
            return {p: self._facts[(p, kind)][1] for p in keys}

    def ranges(self, run: Path, table: str) -> list[tuple[str, float, float]]:
        out: list[tuple[str, float, float]] = []
        for e in _parquet(run / "records" / table):
            try:
                st = e.stat()
            except FileNotFoundError:  # deleted since the listing (a resume drops later steps)
                continue
            key = (st.st_size, st.st_mtime_ns)
            with self._lock:
                cached = self._cache.get(e.path)
            if cached is None or cached[0] != key:
                try:
                    cached = (key, _range(e.path, table))
                except OSError:  # replaced while read: the next call sees the new file
                    continue
                with self._lock:
                    self._cache[e.path] = cached
            if cached[1] is not None:
                out.append((e.path, *cached[1]))
        return out

    def files(self, run: Path, table: str, start: float, end: float) -> list[str]:
        """The files of ``table`` with a row in [start, end]."""
        return sorted(p for p, lo, hi in self.ranges(run, table) if hi >= start and lo <= end)

    def span(self, run: Path) -> tuple[float | None, float | None]:
        """The earliest and latest time of the run's timeline tables."""
        bounds = [
            (lo, hi)
            for t in ("rollout_events", "trainer_spans", "orchestrator_events")
            for _, lo, hi in self.ranges(run, t)
        ]
        if not bounds:
            return None, None
        return min(b[0] for b in bounds), max(b[1] for b in bounds)
