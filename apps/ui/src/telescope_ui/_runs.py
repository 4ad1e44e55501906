"""The runs the inspector serves: found under the folders it was given, named, and described.

A run directory (docs/records.md) holds ``config.yaml``, ``metrics.jsonl`` and ``records/``; a
folder of runs holds run directories. :class:`RunIndex` maps each run's *name* to its path; the
web API only ever takes names, so nothing outside the given folders can be asked for. Runs are
looked up again on every listing, so a run that starts while the inspector is open shows up.

A run's status comes from its record. It is ``running`` while the last attempt has no ``stop``
event and either the process that samples its infrastructure (its driver, named in the ``infra``
file names) is alive on this machine as a telescope command, or its files changed in the last
:data:`LIVE_WINDOW_S` seconds. Otherwise the latest ``stop`` event of any attempt decides (a
``telescope eval`` attempt records none): ``finished``, ``stopped`` (Ctrl-C or SIGTERM) or
``failed`` with its error; with none at all the run was ``killed``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from telescope_ui._metrics import is_dict, training_lines

__all__ = ["RunIndex", "config_diff", "log_tail", "read_config", "read_notes", "write_notes"]

LIVE_WINDOW_S = 120.0
NOTES = "notes.md"
"""The one file the inspector writes: the user's notes on a run, in its run directory."""
MAX_NOTES_CHARS = 100_000
USER_MARK = "# set by you"
"""How ``config.yaml`` marks the keys the user's run YAML or command line set (docs/config.md)."""
_INFRA_FILE = re.compile(r"^a(\d{3})-(.+)-(\d+)-\d+\.parquet$")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _is_run(path: Path) -> bool:
    return path.is_dir() and any((path / n).exists() for n in ("metrics.jsonl", "records", "config.yaml"))


@dataclass(frozen=True)
class Run:
    name: str
    path: Path


class RunIndex:
    """The run directories under ``roots`` (each a run directory or a folder of runs), by name."""

    def __init__(self, roots: Sequence[str | Path]) -> None:
        self.roots = [Path(r).expanduser().resolve() for r in roots]

    def runs(self) -> list[Run]:
        """Every run found now, sorted by name; a name taken twice gets its parent's name before it."""
        found: list[Path] = []
        for root in self.roots:
            if _is_run(root):
                found.append(root)
            elif root.is_dir():
                found += sorted(p for p in root.iterdir() if _is_run(p))
        names = [p.name for p in found]
        out: list[Run] = []
        for p in found:
            name = f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name
            taken = {r.name for r in out}
            out.append(Run(name if name not in taken else f"{name}~{len(out)}", p))
        return sorted(out, key=lambda r: r.name)

    def get(self, name: str) -> Run | None:
        return next((r for r in self.runs() if r.name == name), None)


def read_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The resolved config of a run and the keys the user set (marked in ``config.yaml``)."""
    file = path / "config.yaml"
    if not file.is_file():
        return {}, []
    text = file.read_text(encoding="utf-8", errors="replace")
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return {}, []
    user: list[str] = []
    mark_above = False
    for line in text.splitlines():
        if line.strip() == USER_MARK:
            mark_above = True
            continue
        key = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):", line)
        if key and (mark_above or line.rstrip().endswith(USER_MARK)):
            user.append(key.group(1))
        mark_above = False
    return (data if is_dict(data) else {}), user


def read_notes(path: Path) -> str:
    file = path / NOTES
    return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else ""


def write_notes(path: Path, text: str) -> None:
    """Replace the run's notes (atomically: a reader sees the old or the new text, never half)."""
    if len(text) > MAX_NOTES_CHARS:
        raise ValueError(f"notes are limited to {MAX_NOTES_CHARS:,} characters; these have {len(text):,}")
    tmp = path / f".{NOTES}.tmp-{os.getpid()}"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path / NOTES)


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The top-level keys whose values differ between two configs, with both values."""
    keys = list(dict.fromkeys([*a, *b]))
    return [{"key": k, "a": a.get(k), "b": b.get(k)} for k in keys if a.get(k) != b.get(k)]


def log_tail(path: Path, *, lines: int = 200, level: str | None = None) -> list[dict[str, Any]]:
    """The last ``lines`` entries of the driver's log (``logs/telescope.jsonl``) at ``level`` or above."""
    file = path / "logs" / "telescope.jsonl"
    if not file.is_file():
        return []
    floor = _LOG_LEVELS.index(level) if level in _LOG_LEVELS else 0
    out: list[dict[str, Any]] = []
    for raw in _last_lines(file, 20 * lines):
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            entry = None
        if not is_dict(entry):
            entry = {"event": raw, "level": "info"}
        lvl = str(entry.get("level", entry.get("log_level", "info"))).lower()
        if (_LOG_LEVELS.index(lvl) if lvl in _LOG_LEVELS else 1) >= floor:
            out.append(entry)
    return out[-lines:]


def _last_lines(file: Path, n: int, block: int = 1 << 16) -> list[str]:
    """The last ``n`` lines of a file without reading all of it."""
    with file.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        data = b""
        while end > 0 and data.count(b"\n") <= n:
            start = max(0, end - block)
            fh.seek(start)
            data = fh.read(end - start) + data
            end = start
    return [line for line in data.decode("utf-8", errors="replace").splitlines() if line][-n:]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_telescope(pid: int) -> bool:
    """Whether ``pid`` runs a telescope command (a pid reused by another program is not the driver)."""
    try:
        return b"telescope" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _driver_alive(path: Path, attempt: int) -> bool:
    """Whether a process of this attempt that writes ``infra`` files is alive on this machine."""
    folder = path / "records" / "infra"
    if not folder.is_dir():
        return False
    host = socket.gethostname()
    pids: set[int] = set()
    for name in os.listdir(folder):
        m = _INFRA_FILE.match(name)
        if m and int(m.group(1)) == attempt and m.group(2) == host:
            pids.add(int(m.group(3)))
    return any(_pid_alive(p) and _is_telescope(p) for p in pids)


def _last_change(path: Path) -> float:
    files = ("metrics.jsonl", "records/manifest.json", "logs/telescope.jsonl", "config.yaml")
    times = [(path / f).stat().st_mtime for f in files if (path / f).exists()]
    infra = path / "records" / "infra"
    if infra.is_dir():
        times.append(infra.stat().st_mtime)
    return max(times, default=0.0)


_STOPPED = ("KeyboardInterrupt", "SystemExit", "Interrupted", "SIGTERM")


def status(path: Path, stops: dict[int, dict[str, Any]], attempt: int) -> dict[str, Any]:
    """``{"status": running|finished|stopped|failed|killed, "reason": ...}`` from the ``stop``
    events by attempt and the last attempt's number (see the module docstring)."""
    live = _driver_alive(path, attempt) or time.time() - _last_change(path) < LIVE_WINDOW_S
    if attempt not in stops and live:
        return {"status": "running", "reason": ""}
    if not stops:
        return {"status": "killed", "reason": "the run stopped without recording its end"}
    reason = str(stops[max(stops)].get("reason") or "")
    if reason == "finished":
        return {"status": "finished", "reason": reason}
    return {"status": "stopped" if reason.startswith(_STOPPED) else "failed", "reason": reason}


def progress(metrics: Iterable[dict[str, Any]], total_steps: int | None, running: bool) -> dict[str, Any]:
    """Steps done, the total, and (while running) the ETA from the mean time of the last steps."""
    steps = training_lines(list(metrics))
    done = max((m["step"] for m in steps), default=0)
    times = [
        float(m["timing/step_s"]) for m in steps[-10:] if isinstance(m.get("timing/step_s"), (int, float))
    ]
    eta = None
    if running and total_steps and times and done < total_steps:
        eta = (total_steps - done) * sum(times) / len(times)
    return {"step": done, "total_steps": total_steps, "eta_s": eta}
