"""The result of running one program in a sandbox, and the heuristics that say which limit ended it."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from telescope_sandbox._errors import (
    SandboxCPULimitError,
    SandboxDiskLimitError,
    SandboxLimitError,
    SandboxMemoryError,
    SandboxOutputLimitError,
    SandboxTimeoutError,
)

__all__ = ["ExecResult", "KilledBy", "classify_end"]

KilledBy = Literal["timeout", "cpu", "memory", "output", "disk", "signal"]

_EMPTY: Mapping[str, bytes] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a finished program left behind.

    ``exit_code`` is the program's exit status (negative: killed by that signal, so ``-9`` is
    SIGKILL); ``timed_out`` is true when the wall-clock limit ended it; ``duration_s`` is wall
    time in seconds from start to exit, sandbox setup included. ``killed_by`` names the limit
    that ended the program (``None``: it ended by itself; see ``classify_end`` for how it is
    inferred). ``output_truncated`` is true when stdout or stderr was cut to
    ``max_output_bytes``. ``files`` holds the files asked for with ``files_out`` that existed
    after the run (path relative to the work directory -> content). ``cpu_time_s`` and
    ``max_rss_mb`` come from the kernel's accounting of the program's process tree where the
    provider can measure them, else ``None``.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration_s: float = 0.0
    killed_by: KilledBy | None = None
    output_truncated: bool = False
    files: Mapping[str, bytes] = field(default_factory=lambda: _EMPTY)
    cpu_time_s: float | None = None
    max_rss_mb: float | None = None

    @property
    def ok(self) -> bool:
        """True when the program exited by itself with status 0."""
        return self.exit_code == 0 and not self.timed_out and self.killed_by is None

    def raise_for_limit(self) -> ExecResult:
        """Raise the ``SandboxLimitError`` subclass matching ``killed_by``; else return ``self``.

        A plain non-zero exit or a crash by a signal is the program's own doing and raises
        nothing.
        """
        errors: dict[str, type[SandboxLimitError]] = {
            "timeout": SandboxTimeoutError,
            "cpu": SandboxCPULimitError,
            "memory": SandboxMemoryError,
            "output": SandboxOutputLimitError,
            "disk": SandboxDiskLimitError,
        }
        error = errors.get(self.killed_by or "")
        if error is not None:
            raise error(f"program stopped by the {self.killed_by} limit after {self.duration_s:.2f} s", self)
        return self


_STDERR_MARKERS: tuple[tuple[KilledBy, tuple[str, ...]], ...] = (
    ("cpu", ("CPU time limit exceeded",)),
    ("memory", ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")),
    (
        "disk",
        ("No space left on device", "File too large", "File size limit exceeded", "Disk quota exceeded"),
    ),
)
"""What a program's last words say about the limit that ended it, checked in this order."""


def classify_end(
    *,
    exit_code: int,
    stderr_tail: str,
    timed_out: bool,
    output_killed: bool,
    cpu_time_s: float | None,
    cpu_limit_s: float,
) -> KilledBy | None:
    """Infer which limit ended a program. Heuristics, in this order:

    1. We killed it at the wall-clock deadline -> ``"timeout"``; for output -> ``"output"``.
    2. Signal SIGXCPU (soft ``RLIMIT_CPU``), or SIGKILL when the measured CPU time reached the
       limit (the hard ``RLIMIT_CPU`` is one second above the soft one) -> ``"cpu"``.
    3. Signal SIGXFSZ (``RLIMIT_FSIZE``) -> ``"disk"``.
    4. A non-zero exit whose last 2 KiB of stderr hold a shell's report of a child killed by
       ``RLIMIT_CPU`` (``CPU time limit exceeded``) -> ``"cpu"``; an allocation failure
       (Python's ``MemoryError``, ``Cannot allocate memory``, ``std::bad_alloc``,
       ``out of memory``) -> ``"memory"``; a full disk or a too-large file (``No space left on
       device``, ``File too large``, ``File size limit exceeded``) -> ``"disk"``
       (``_STDERR_MARKERS``).
    5. Any other signal -> ``"signal"``; otherwise ``None``.

    The program writes its own stderr, so it can fake 4; treat ``killed_by`` as a diagnosis,
    never as a security decision.
    """
    if output_killed:
        return "output"
    if timed_out:
        return "timeout"
    found: KilledBy | None = _by_signal(-exit_code, cpu_time_s, cpu_limit_s) if exit_code < 0 else None
    if found is None and exit_code != 0:
        tail = stderr_tail[-2048:]
        found = next((kind for kind, markers in _STDERR_MARKERS if any(m in tail for m in markers)), None)
    if found is None and exit_code < 0:
        found = "signal"
    return found


def _by_signal(sig: int, cpu_time_s: float | None, cpu_limit_s: float) -> KilledBy | None:
    """The limit a terminating signal stands for (steps 2 and 3 of ``classify_end``), if any."""
    if sig == signal.SIGXCPU or (
        sig == signal.SIGKILL and cpu_time_s is not None and cpu_time_s >= cpu_limit_s
    ):
        return "cpu"
    if sig == signal.SIGXFSZ:
        return "disk"
    return None
