"""The console of ``telescope train``: one line per start-up phase, then a rich progress bar.

Only these lines reach the terminal; logs of every component go to the run directory.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

__all__ = ["Console"]


class Console:
    """Start-up phases (``with console.phase("starting vLLM"):``) and the training progress bar."""

    def __init__(self, total_steps: int, *, enabled: bool = True) -> None:
        from rich.console import Console as RichConsole

        self.rich = RichConsole(stderr=True, highlight=False)
        self.total = total_steps
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    @contextmanager
    def phase(self, text: str):
        t0 = time.monotonic()
        if self.enabled:
            self.rich.print(f"[bold]•[/bold] {text} ...")
        yield
        if self.enabled:
            self.rich.print(f"  [green]done[/green] {text} ({time.monotonic() - t0:.1f} s)")

    def info(self, text: str) -> None:
        if self.enabled:
            self.rich.print(text)

    def start_training(self, first_step: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=self.rich,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=self.total, completed=first_step, stats="")

    def step(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        reward = metrics.get("reward/mean", float("nan"))
        tps = metrics.get("throughput/tokens_per_s", float("nan"))
        stats = f"reward {reward:.3f}  {tps:,.0f} tok/s  async {metrics.get('async_level', 0)}"
        if self._progress is None:
            self.rich.print(f"step {metrics.get('step')}/{self.total}  {stats}")
            return
        self._progress.update(self._task, completed=metrics.get("step", 0), stats=stats)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
