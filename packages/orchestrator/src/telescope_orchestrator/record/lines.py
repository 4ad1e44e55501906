"""A run's metrics lines: each goes to ``metrics.jsonl`` and, when the run logs there, to W&B.

The loop writes one line per step; evals write a line of their own when they end (``step`` = the
step whose weights they measured). W&B cannot go back to an earlier step: a line of an earlier
step than the latest logged (a periodic eval that ended after later steps) is logged at the latest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telescope_orchestrator.record.rundir import RunDir

__all__ = ["MetricsLines"]


class MetricsLines:
    """Where the metrics lines of a run go (module docstring)."""

    def __init__(self, run: RunDir, wandb: Any = None, *, start_step: int = 0) -> None:
        self.run = run
        self.wandb = wandb
        """The W&B run (``wandb.Run``, an optional dependency), or None."""
        self.wandb_step = start_step
        """The latest step logged to W&B."""

    def write(
        self, metrics: Mapping[str, Any], *, step: int, file_only: Mapping[str, Any] | None = None
    ) -> None:
        """One line of step ``step``: ``file_only`` then ``metrics`` in ``metrics.jsonl``,
        ``metrics`` but their ``step`` key in W&B."""
        self.run.append_metrics({**(file_only or {}), **metrics})
        if self.wandb is not None:
            self.wandb_step = max(self.wandb_step, step)
            self.wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=self.wandb_step)
