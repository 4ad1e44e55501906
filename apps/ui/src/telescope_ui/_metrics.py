"""``metrics.jsonl`` for the pages: read incrementally, and shaped as columns.

A live run appends one line per step; :class:`MetricsCache` keeps the lines it parsed and reads
only the bytes added since. A file rewritten in place (a resumed run drops the steps it redoes)
is read again from the start: it is either shorter than what was read, or no longer ends, at the
offset read so far, with the bytes that were there.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, TypeGuard

__all__ = ["MetricsCache", "discarded_by_reason", "is_dict", "metric_columns", "training_lines"]

_DISCARDED = "derived/discarded/"
_TAIL = 256
"""Bytes before the offset read so far that must be unchanged for the cached lines to stand."""


class MetricsCache:
    """Parsed lines of each run's ``metrics.jsonl``, kept up to date by reading what was appended."""

    def __init__(self) -> None:
        self._runs: dict[Path, tuple[int, bytes, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def lines(self, run: Path) -> list[dict[str, Any]]:
        file = run / "metrics.jsonl"
        try:
            size = os.stat(file).st_size
        except FileNotFoundError:
            return []
        with self._lock, file.open("rb") as fh:
            offset, tail, lines = self._runs.get(run, (0, b"", []))
            fh.seek(max(0, offset - len(tail)))
            if size < offset or fh.read(len(tail)) != tail:
                offset, tail, lines = 0, b"", []
            if size > offset:
                fh.seek(offset)
                data = fh.read(size - offset)
                end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
                lines = lines + _parse(data[:end])
                offset += end
                tail = (tail + data[:end])[-_TAIL:]
            self._runs[run] = (offset, tail, lines)
            return lines


def is_dict(value: object) -> TypeGuard[dict[Any, Any]]:
    """Whether ``value`` (parsed JSON or YAML, which can be anything) is a dict."""
    return isinstance(value, dict)


def _parse(data: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if is_dict(row):
            out.append(row)
    return out


def training_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of training steps (an eval's line carries ``eval/step``)."""
    return [m for m in lines if "eval/step" not in m and isinstance(m.get("step"), int)]


def metric_columns(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The training lines as columns: ``{"keys": [...], "columns": {key: [value per line]}}``
    (a key a line lacks is null there; ``step`` and ``time`` are columns like the others)."""
    train = training_lines(lines)
    keys = sorted({k for m in train for k, v in m.items() if isinstance(v, (int, float)) or v is None})
    return {"keys": keys, "columns": {k: [m.get(k) for m in train] for k in keys}}


def discarded_by_reason(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Dropped groups per step and reason (``derived/discarded/<reason>_count``), and cancelled."""
    train = training_lines(lines)
    reasons = sorted(
        {
            k[len(_DISCARDED) : -len("_count")]
            for m in train
            for k in m
            if k.startswith(_DISCARDED) and k.endswith("_count")
        }
    )
    return {
        "steps": [m["step"] for m in train],
        "reasons": {r: [m.get(f"{_DISCARDED}{r}_count") or 0 for m in train] for r in reasons},
        "cancelled": [m.get("derived/cancelled_count") or 0 for m in train],
    }
