"""What a run tells the person watching it: the ``Reporter`` protocol and a silent one.

The run calls a reporter for its start-up phases, plain notices and warnings, each step's
metrics and the reports of a step waiting for its batch. The ``telescope`` command's console
(rich, in ``telescope_cli``) is one implementation; ``SilentReporter`` is the other, for a run
driven from Python that watches its steps through the API instead. A reporter only shows: the
run's record hears of every phase through ``on_phase`` whichever reporter runs.

``info`` text may carry console markup (``[yellow]...[/yellow]``); a reporter that does not
render it removes it with ``plain_text``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

__all__ = ["PhaseHook", "Reporter", "SilentReporter", "plain_text"]

PhaseHook = Callable[[str, float, float], None]
"""``(phase text, wall clock at its start, seconds it took)``."""

_MARKUP = re.compile(r"\[/?(?:bold|green|yellow|red|dim|cyan)\]")


def plain_text(text: str) -> str:
    """``text`` without the console markup the run's notices use."""
    return _MARKUP.sub("", text)


class Reporter(Protocol):
    """What the run calls while it starts, trains and stops (module docstring)."""

    @property
    def on_phase(self) -> PhaseHook | None:
        """Set by the run: hears of each phase when it ends, whether it succeeded or not."""
        ...

    @on_phase.setter
    def on_phase(self, hook: PhaseHook | None) -> None: ...

    def phase(self, text: str) -> AbstractContextManager[None]:
        """A start-up or shutdown phase, as ``with reporter.phase("model"):``."""
        ...

    def info(self, text: str) -> None: ...

    def warning(self, text: str) -> None: ...

    def start_training(self, first_step: int) -> None: ...

    def step(self, metrics: dict[str, Any]) -> None: ...

    def waiting(self, step: int, waited_s: float, line: str, *, plain: bool) -> None:
        """Step ``step`` has waited ``waited_s`` for its batch; ``line`` says how it is going;
        ``plain`` marks a full report (a console without a bar prints those only)."""
        ...

    def close(self) -> None: ...


class SilentReporter:
    """A reporter that shows nothing (a run driven from Python); phases still reach ``on_phase``."""

    def __init__(self) -> None:
        self.on_phase: PhaseHook | None = None

    @contextmanager
    def phase(self, text: str) -> Generator[None]:
        t0, at = time.monotonic(), time.time()
        try:
            yield
        finally:
            if self.on_phase is not None:
                self.on_phase(text, at, time.monotonic() - t0)

    def info(self, text: str) -> None:
        pass

    def warning(self, text: str) -> None:
        pass

    def start_training(self, first_step: int) -> None:
        pass

    def step(self, metrics: dict[str, Any]) -> None:
        pass

    def waiting(self, step: int, waited_s: float, line: str, *, plain: bool) -> None:
        pass

    def close(self) -> None:
        pass
