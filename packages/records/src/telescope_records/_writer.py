"""Writing a run's record: atomic Parquet files under ``RUN_DIR/records/<table>/``.

Layout (docs/records.md, "Files")::

    records/manifest.json                       format version, each table's version, the attempts
    records/<table>/step_NNNNNN[-tag].parquet   step tables: one file per step (and per tag), written
                                                when the step's records are
    records/<table>/attempt_NNN[-tag].parquet   attempt tables (environments, setup, model)
    records/<table>/aNNN-<node>-<pid>-<seq>.parquet
                                                time tables (infra): one file per flush of one process

Every file is written to a hidden temporary name in its folder and renamed into place, so a run
killed at any moment (SIGKILL included) leaves only complete files; the temporary names do not
match ``*.parquet``. Nothing stays buffered beyond one flush: step files are written at once, time
tables are flushed every ``flush_every_s`` seconds (checked on each append) or at
``max_rows``, whichever comes first, and on :meth:`RecordWriter.close`.

Resume (``RecordWriter(run_dir, resume_from=N)``): step files of steps after ``N`` are deleted
before the new attempt writes anything, so the redone steps appear once; time tables keep what was
measured (their rows carry the attempt). A run directory whose manifest has another format, or a
table at another version, is refused with the fix (a new run directory).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import structlog

from telescope_records import _arrow as arrow
from telescope_records._rows import ListColumn, columns_to_arrow, to_arrow
from telescope_records._schema import FORMAT_VERSION, TABLES, table

__all__ = ["RecordError", "RecordWriter", "read_manifest", "records_dir"]

log = structlog.get_logger()

_STEP_FILE = re.compile(r"^step_(\d+)(?:-.*)?\.parquet$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _step_file(step: int, tag: str) -> str:
    """A step table's file name (module docstring)."""
    return f"step_{step:06d}{'-' + _safe(tag) if tag else ''}.parquet"


class RecordError(RuntimeError):
    """The run directory's record cannot be written as asked; the message says how to fix it."""


def records_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "records"


_MANIFEST_FIX = "restore it, or move the run's records/ folder aside to start a new record"


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """``records/manifest.json`` of a run ({} when it has none); a ``RecordError`` when it is not
    a JSON object (edited or damaged by hand: the writer replaces it atomically)."""
    path = records_dir(run_dir) / "manifest.json"
    if not path.is_file():
        return {}
    try:
        manifest: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RecordError(f"{path} cannot be read ({err}): {_MANIFEST_FIX}") from None
    if not isinstance(manifest, dict):
        raise RecordError(f"{path} is not a JSON object: {_MANIFEST_FIX}")
    return cast(dict[str, Any], manifest)


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_") or "x"


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


class RecordWriter:
    """The writer of one process; see the module docstring.

    ``RecordWriter(run_dir)`` opens (or starts) the record as a new attempt and owns the manifest;
    ``RecordWriter.attach(run_dir, attempt)`` is for the other processes of a run (a trainer rank,
    a sampler on another node): it writes files, never the manifest, and deletes nothing.
    Thread-safe.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        resume_from: int | None = None,
        flush_every_s: float = 5.0,
        max_rows: int = 20_000,
        _attempt: int | None = None,
    ) -> None:
        self.root = records_dir(run_dir)
        self.flush_every_s = flush_every_s
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._buffers: dict[str, list[Mapping[str, Any]]] = {}
        self._last_flush = time.monotonic()
        self._seq = 0
        self._prefix = f"{_safe(os.uname().nodename)}-{os.getpid()}"
        if _attempt is None:
            self.attempt = self._open(resume_from)
        else:
            self.attempt = _attempt

    @classmethod
    def attach(cls, run_dir: str | Path, attempt: int, **kwargs: Any) -> RecordWriter:
        """A writer for another process of the same attempt (no manifest, no deletions)."""
        return cls(run_dir, _attempt=attempt, **kwargs)

    # ---------------------------------------------------------------- manifest and resume
    def _open(self, resume_from: int | None) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(self.root.parent)
        if manifest:
            self._check(manifest)
        attempts: list[dict[str, Any]] = list(manifest.get("attempts", []))
        if resume_from is not None:
            self._drop_after(resume_from)
        attempt = len(attempts)
        attempts.append({"attempt": attempt, "started": time.time(), "resumed_from": resume_from})
        tables = {name: t.version for name, t in TABLES.items()}
        new = {"format": FORMAT_VERSION, "tables": tables, "attempts": attempts}
        _atomic_text(self.root / "manifest.json", json.dumps(new, indent=1))
        return attempt

    def _check(self, manifest: Mapping[str, Any]) -> None:
        if manifest.get("format") != FORMAT_VERSION:
            raise RecordError(
                f"{self.root} holds records of format {manifest.get('format')}, this Telescope writes "
                f"format {FORMAT_VERSION}: resume it with the Telescope that started it, or start a new run "
                "in another run directory"
            )
        old = manifest.get("tables", {})
        changed = {n: (old[n], t.version) for n, t in TABLES.items() if n in old and old[n] != t.version}
        if changed:
            raise RecordError(
                f"{self.root}: table versions changed since the run started ({changed}, old -> new): "
                "resume it with the Telescope that started it, or start a new run in another run directory"
            )

    def _drop_after(self, step: int) -> None:
        """Delete step files of steps after ``step`` and leftover temporary files."""
        for name, t in TABLES.items():
            folder = self.root / name
            if t.key != "step" or not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = _STEP_FILE.match(path.name)
                if (match and int(match.group(1)) > step) or ".tmp-" in path.name:
                    path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------- writing
    def _write(self, table_name: str, file_name: str, rows: Iterable[Mapping[str, Any]]) -> Path | None:
        return self._write_table(table_name, file_name, to_arrow(table(table_name), rows))

    def _write_table(self, table_name: str, file_name: str, data: arrow.ArrowTable) -> Path | None:
        if data.num_rows == 0:
            return None
        folder = self.root / table_name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / file_name
        tmp = folder / f".{file_name}.tmp-{os.getpid()}-{threading.get_ident()}"
        arrow.write_table(data, tmp, compression="zstd")
        tmp.replace(path)
        return path

    def _expect(self, table_name: str, key: str) -> None:
        if table(table_name).key != key:
            raise ValueError(f"record table {table_name!r} is keyed by {table(table_name).key}, not {key}")

    def write_step(
        self, table_name: str, step: int, rows: Iterable[Mapping[str, Any]], *, tag: str = ""
    ) -> Path | None:
        """Write one step's rows of a step table now (``attempt`` filled in); None when empty.

        Writing the same (table, step, tag) again replaces the file: a step's rows are written once.
        """
        self._expect(table_name, "step")
        name = _step_file(step, tag)
        return self._write(table_name, name, (self._stamped(r) for r in rows))

    def write_step_columns(
        self,
        table_name: str,
        step: int,
        columns: Mapping[str, Sequence[Any] | ListColumn],
        rows: int,
        *,
        tag: str = "",
    ) -> Path | None:
        """:meth:`write_step` with whole columns (``columns_to_arrow``): for a table with many list
        entries a row, converted without a Python object per entry."""
        self._expect(table_name, "step")
        name = _step_file(step, tag)
        given = columns if "attempt" in columns else {**columns, "attempt": [self.attempt] * rows}
        return self._write_table(table_name, name, columns_to_arrow(table(table_name), given, rows))

    def write_attempt(
        self, table_name: str, rows: Iterable[Mapping[str, Any]], *, tag: str = ""
    ) -> Path | None:
        """Write the rows of an attempt table (environments, setup, model) for this attempt."""
        self._expect(table_name, "attempt")
        name = f"attempt_{self.attempt:03d}{'-' + _safe(tag) if tag else ''}.parquet"
        return self._write(table_name, name, (self._stamped(r) for r in rows))

    def append(self, table_name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer rows of a time table; flushes when due (see the module docstring)."""
        self._expect(table_name, "time")
        stamped = [self._stamped(r) for r in rows]
        with self._lock:
            self._buffers.setdefault(table_name, []).extend(stamped)
            due = time.monotonic() - self._last_flush >= self.flush_every_s
            full = sum(len(b) for b in self._buffers.values()) >= self.max_rows
        if due or full:
            self.flush()

    def flush(self) -> None:
        """Write every buffered row now (one file per table)."""
        with self._lock:
            buffers, self._buffers = self._buffers, {}
            self._last_flush = time.monotonic()
            self._seq += 1
            seq = self._seq
        for name, rows in buffers.items():
            if rows:
                self._write(name, f"a{self.attempt:03d}-{self._prefix}-{seq:06d}.parquet", rows)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stamped(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        return row if "attempt" in row else {**row, "attempt": self.attempt}
