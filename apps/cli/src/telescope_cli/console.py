"""The console of ``telescope train``: one line per start-up phase, then the training progress.

On a terminal the progress is a rich progress bar. When the console's stream (stderr) is not a
terminal (a pipe, a file, CI), a bar would show nothing until the end, so each step prints one
plain line instead, flushed at once, with no escape codes::

    step 3/15  reward 0.125  1,234 tok/s  time 12.3 s  async 1

A step that waits long for its batch says how the batch is going (``waiting``): on a terminal in
the bar's place, updated at each report; otherwise one line at each full report (``run.waiting``:
after 10 s of waiting, then every 30 s with the default ``event_upload_interval_seconds``)::

    step 3/15  waiting 25 s: kept 0/2 groups, dropped 14 (zero_advantage 14), 4 in flight; every
    finished group scored 0.0

Only these lines reach the console; logs of every component go to the run directory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["Console", "step_stats"]


def step_stats(metrics: dict[str, Any]) -> str:
    """The numbers of one step's line: reward, tokens per second, step time, async level (a
    supervised step: its loss instead of a reward)."""
    nan = float("nan")
    if "sft/loss" in metrics:
        tps, step_s = metrics.get("throughput/tokens_per_s", nan), metrics.get("timing/step_s", nan)
        return f"sft loss {metrics['sft/loss']:.3f}  {tps:,.0f} tok/s  time {step_s:.1f} s"
    reward = metrics.get("reward/mean", nan)
    tps = metrics.get("throughput/tokens_per_s", nan)
    step_s = metrics.get("timing/step_s", nan)
    return (
        f"reward {reward:.3f}  {tps:,.0f} tok/s  time {step_s:.1f} s  async {metrics.get('async_level', 0)}"
    )


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


class Console:
    """Start-up phases (``with console.phase("starting vLLM"):``) and the training progress.

    ``file`` is the stream to write to (default: stderr). ``plain`` is true when that stream is not
    a terminal: no bar and no colours (whatever FORCE_COLOR says), one line per step.
    """

    def __init__(self, total_steps: int, *, enabled: bool = True, file: IO[str] | None = None) -> None:
        from rich.console import Console as RichConsole

        self.plain = not _is_tty(sys.stderr if file is None else file)
        where: dict[str, Any] = {"stderr": True} if file is None else {"file": file}
        self.rich = RichConsole(
            highlight=False,
            # not a terminal: no escape codes at all, and no wrapping at 80 columns
            force_terminal=False if self.plain else None,
            soft_wrap=self.plain,
            **where,
        )
        self.total = total_steps
        self.enabled = enabled
        self.on_phase: Callable[[str, float, float], None] | None = None
        self._progress: Any = None
        self._task: Any = None

    @contextmanager
    def phase(self, text: str):
        """A start-up phase: a line before, one after with its duration; ``on_phase(text, wall
        clock at start, seconds)`` hears of it either way (the run's record)."""
        t0, at = time.monotonic(), time.time()
        if self.enabled:
            self.rich.print(f"[bold]•[/bold] {text} ...")
        try:
            yield
        finally:
            if self.on_phase is not None:
                self.on_phase(text, at, time.monotonic() - t0)
        if self.enabled:
            self.rich.print(f"  [green]done[/green] {text} ({time.monotonic() - t0:.1f} s)")

    def info(self, text: str) -> None:
        if self.enabled:
            self.rich.print(text)

    def warning(self, text: str) -> None:
        """``warning: text`` on its own line (``text`` printed as is, never read as markup)."""
        from rich.markup import escape

        if self.enabled:
            self.rich.print(f"[yellow]warning[/yellow]: {escape(text)}")

    def start_training(self, first_step: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        if not self.enabled or self.plain:
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
        stats = step_stats(metrics)
        if self.plain:
            self._plain_line(metrics.get("step"), stats)
            return
        if self._progress is None:
            self.rich.print(f"step {metrics.get('step')}/{self.total}  {stats}")
            return
        self._progress.update(self._task, completed=metrics.get("step", 0), stats=stats)

    def waiting(self, step: int, waited_s: float, line: str, *, plain: bool) -> None:
        """Step ``step`` has waited ``waited_s`` for its batch; ``line`` says how it is going
        (module docstring). The bar shows it; a plain console prints it when ``plain``."""
        if not self.enabled:
            return
        text = f"waiting {waited_s:.0f} s: {line}"
        if self._progress is not None:
            self._progress.update(self._task, stats=text)
            return
        if plain:
            self._plain_line(step, text)

    def _plain_line(self, step: Any, text: str) -> None:
        """``step N/total  text``, written as is (no markup, no wrapping) and flushed: a pipe sees
        each line when it happens."""
        stream = self.rich.file
        stream.write(f"step {step}/{self.total}  {text}\n")
        stream.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
