"""The run directory: the local, primary record of a training run.

Layout (``runs/<wandb_run_name>/`` when the config sets that name, else ``runs/<timestamp>/``;
``--run-dir`` or ``$TELESCOPE_RUN_DIR`` pick another place)::

    config.yaml            the resolved config (every field)
    metrics.jsonl          one JSON object per training step, plus one per baseline (step 0),
                           periodic or final eval, with the evaluated step, written when the eval ends
    records/               the run's record (docs/records.md): every sample, turn, tool call, eval
                           completion, timeline event, trainer span and infrastructure sample
    logs/telescope.jsonl   structured logs of the driver (structlog, JSON lines)
    logs/inference/        one log file per vLLM server
    logs/trainer/          one log file per trainer rank
    logs/guard.log         what the run guard stopped after the driver died (one line per sweep)
    checkpoints/           unless checkpoint_dir is set
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telescope_orchestrator.record.writer import RunRecords

__all__ = ["RunDir", "choose_run_dir"]


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says how to fix it."""


def choose_run_dir(
    *, explicit: str | None, run_name: str | None, resuming: bool, root: Path | None = None
) -> Path:
    """Pick the run directory (see the module docstring); a fresh run never reuses a used one."""
    chosen = explicit or os.environ.get("TELESCOPE_RUN_DIR")
    if chosen:
        path = Path(chosen).expanduser()
    else:
        base = (root or Path.cwd()) / "runs"
        path = base / (run_name or time.strftime("%Y%m%d-%H%M%S"))
    if not resuming and (path / "metrics.jsonl").is_file() and (path / "metrics.jsonl").stat().st_size:
        raise RunDirError(
            f"run directory {path} already holds a run. Resume it with --resume_from_checkpoint true "
            "(same --run-dir), or start a new run with another --run-dir or --wandb_run_name."
        )
    if resuming and not path.is_dir():
        raise RunDirError(
            f"cannot resume: run directory {path} does not exist. Pass the directory of the run to resume "
            "with --run-dir (or the same --wandb_run_name)."
        )
    return path


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null marks a missing value
    return value


@dataclass
class RunDir:
    """Paths of one run and the writers of its records."""

    path: Path
    records: RunRecords = field(init=False, repr=False)
    """The run's record (:mod:`telescope_orchestrator.record.writer`); its files are opened on first write."""

    def __post_init__(self) -> None:
        from telescope_orchestrator.record.writer import RunRecords

        self.path = Path(self.path)
        for sub in ("logs/inference", "logs/trainer"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        self.records = RunRecords(self.path)

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def log_file(self) -> Path:
        return self.path / "logs" / "telescope.jsonl"

    def checkpoints(self, checkpoint_dir: str | None) -> Path:
        return Path(checkpoint_dir).expanduser() if checkpoint_dir else self.path / "checkpoints"

    def write_config(self, yaml_text: str) -> None:
        (self.path / "config.yaml").write_text(yaml_text, encoding="utf-8")

    def append_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Append one step's metrics as one JSON line (flushed at once: a kill loses nothing)."""
        line = json.dumps({k: _clean(v) for k, v in metrics.items()}, sort_keys=False)
        with self.metrics_file.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metric lines after ``last_step`` (a resumed run redoes those steps)."""
        if not self.metrics_file.is_file():
            return
        keep = [
            line
            for line in self.metrics_file.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step
        ]
        self.metrics_file.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_file.is_file():
            return []
        text = self.metrics_file.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
