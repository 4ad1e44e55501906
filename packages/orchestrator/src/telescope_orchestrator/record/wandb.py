"""Files a W&B run uploads beside its metrics: the source tree at the start, the logs at the end.

* ``wandb_upload_code``: the files under the working directory (the run's code in W&B), walking past
  every directory or file whose name matches a ``wandb_code_exclude_patterns`` pattern (fnmatch),
  the run directory, symlinks and files over ``wandb_code_max_file_size_mb``; at most
  ``MAX_CODE_FILES`` files (a run started from a home directory does not upload it all).
* ``wandb_upload_logs``: the driver's structured log ``logs/telescope.jsonl`` (debug lines
  included when ``debug`` is on) and the run guard's log; ``wandb_upload_logs_stdout``: the raw
  output of every vLLM server, trainer rank and Ray (``logs/*/*.log``, ``logs/ray.log``).
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

__all__ = ["MAX_CODE_FILES", "code_files", "log_files", "save_logs", "upload_code"]

log = structlog.get_logger()

MAX_CODE_FILES = 5000


def _excluded(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def code_files(
    root: Path,
    *,
    exclude: Sequence[str],
    max_mb: float,
    skip: Iterable[Path] = (),
    limit: int = MAX_CODE_FILES,
) -> list[Path]:
    """The files of the source tree under ``root`` that the code upload takes, sorted."""
    skipped = {Path(p).resolve() for p in skip}
    max_bytes = max_mb * 2**20
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if not _excluded(d, exclude) and (here / d).resolve() not in skipped
        )
        for name in sorted(filenames):
            path = here / name
            if _excluded(name, exclude) or path.is_symlink() or not path.is_file():
                continue
            if path.stat().st_size > max_bytes:
                continue
            out.append(path)
            if len(out) >= limit:
                log.warning("code upload stopped at the file limit", root=str(root), files=limit)
                return sorted(out)
    return sorted(out)


def _take_all(path: str, root: str) -> bool:
    """W&B's ``include_fn`` for ``log_code``: every file (the tree holds the chosen ones only)."""
    return True


def upload_code(wb: Any, cfg: TelescopeConfig, *, root: Path, run_dir: Path) -> int:
    """Log the source tree under ``root`` as the run's code (W&B's ``log_code``); returns how many
    files the code artifact holds.

    ``log_code`` walks every file under its root, so it gets a temporary tree of links to the chosen
    files only (it copies them into the artifact before returning).
    """
    files = code_files(
        root, exclude=cfg.wandb_code_exclude_patterns, max_mb=cfg.wandb_code_max_file_size_mb, skip=[run_dir]
    )
    with tempfile.TemporaryDirectory(prefix="telescope-code-") as tmp:
        for path in files:
            link = Path(tmp) / path.relative_to(root)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path.resolve())
        artifact = wb.log_code(tmp, include_fn=_take_all)
    uploaded = len(artifact.manifest.entries) if artifact is not None else 0
    log.info("wandb code upload", root=str(root), files=uploaded)
    return uploaded


def log_files(run_dir: Path, cfg: TelescopeConfig) -> list[Path]:
    """The run's log files that the W&B run uploads at its end (those that exist)."""
    logs = run_dir / "logs"
    files: list[Path] = []
    if cfg.wandb_upload_logs:
        files += [logs / "telescope.jsonl", logs / "guard.log"]
    if cfg.wandb_upload_logs_stdout:
        files += [*sorted(logs.glob("*/*.log")), logs / "ray.log"]
    return [f for f in files if f.is_file()]


def save_logs(wb: Any, cfg: TelescopeConfig, run_dir: Path) -> None:
    """Hand the run's log files to ``wb`` (uploaded now online; with ``wandb sync`` offline)."""
    for path in log_files(run_dir, cfg):
        wb.save(str(path), base_path=str(run_dir), policy="now")
