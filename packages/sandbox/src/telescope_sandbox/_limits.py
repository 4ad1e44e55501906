"""Resource limits of one run, their validation, and how they become kernel rlimits.

Every field is a ceiling for one run. The local provider enforces them as follows:

| field | enforced by |
| --- | --- |
| ``timeout_s`` | the host kills the sandbox's whole process tree (its PID namespace) at the deadline |
| ``cpu_time_s`` | ``RLIMIT_CPU`` per process: SIGXCPU at the limit, SIGKILL one second later |
| ``memory_mb`` | ``RLIMIT_AS`` per process (address space, so a bit above resident memory) |
| ``max_processes`` | ``RLIMIT_NPROC`` on a user id that only this run uses |
| ``max_open_files`` | ``RLIMIT_NOFILE`` |
| ``max_file_mb`` | ``RLIMIT_FSIZE``: the largest file the program may write |
| ``disk_mb`` | the size of the work directory's tmpfs (``/tmp`` and ``/dev/shm`` get the same cap each) |
| ``max_output_bytes`` | the host keeps that many bytes of stdout and of stderr (each) |

A stream that passes ``OUTPUT_KILL_FACTOR`` times ``max_output_bytes`` gets the run killed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from telescope_sandbox._errors import SandboxRequestError

__all__ = ["OUTPUT_KILL_FACTOR", "Limits"]

OUTPUT_KILL_FACTOR = 8
"""A stream past ``OUTPUT_KILL_FACTOR * max_output_bytes`` gets the run killed (``killed_by="output"``)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Ceilings for one run; see the module docstring for how each is enforced.

    ``cpu_time_s=None`` means ``timeout_s + 1`` rounded up, so the wall-clock limit normally
    fires first and ``"cpu"`` only shows up when you set a tighter CPU budget.
    """

    timeout_s: float = 10.0
    """Wall-clock seconds from start to kill, sandbox setup included; > 0."""
    memory_mb: int = 512
    """Address space per process in MiB; >= 16. Python itself needs about 30."""
    cpu_time_s: float | None = None
    """CPU seconds per process (whole seconds, rounded up); None: ``timeout_s + 1``."""
    max_processes: int = 64
    """Processes and threads the program may have at once; >= 1."""
    max_open_files: int = 256
    """Open file descriptors per process; >= 16."""
    max_file_mb: int = 64
    """Largest file the program may write, MiB; >= 1."""
    disk_mb: int = 128
    """Size of the writable work directory (a tmpfs), MiB; >= 1."""
    max_output_bytes: int = 1 << 20
    """Bytes of stdout and of stderr kept (each); >= 1. More is dropped and flagged."""

    def __post_init__(self) -> None:
        minimums = {
            "timeout_s": 0.0,
            "memory_mb": 16,
            "max_processes": 1,
            "max_open_files": 16,
            "max_file_mb": 1,
            "disk_mb": 1,
            "max_output_bytes": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise SandboxRequestError(f"{name} must be a number, got {value!r}")
            if value < minimum or (name == "timeout_s" and value <= 0):
                bound = "> 0" if name == "timeout_s" else f">= {minimum}"
                raise SandboxRequestError(f"{name} must be {bound}, got {value!r}")
        if self.cpu_time_s is not None and not _positive_number(self.cpu_time_s):
            raise SandboxRequestError(f"cpu_time_s must be > 0 or None, got {self.cpu_time_s!r}")

    @property
    def cpu_seconds(self) -> int:
        """The soft ``RLIMIT_CPU`` in whole seconds (the hard limit is one more)."""
        cpu = self.cpu_time_s if self.cpu_time_s is not None else self.timeout_s + 1
        return max(1, math.ceil(cpu))

    def rlimits(self) -> list[tuple[str, int, int]]:
        """``(resource name, soft, hard)`` triples for ``resource.setrlimit`` inside the sandbox."""
        mib = 1 << 20
        return [
            ("RLIMIT_CPU", self.cpu_seconds, self.cpu_seconds + 1),
            ("RLIMIT_AS", int(self.memory_mb) * mib, int(self.memory_mb) * mib),
            ("RLIMIT_NPROC", int(self.max_processes), int(self.max_processes)),
            ("RLIMIT_NOFILE", int(self.max_open_files), int(self.max_open_files)),
            ("RLIMIT_FSIZE", int(self.max_file_mb) * mib, int(self.max_file_mb) * mib),
            ("RLIMIT_CORE", 0, 0),
        ]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of every limit, for error messages."""
        return tuple(f.name for f in fields(cls))


def _positive_number(value: object) -> bool:
    """Whether ``value`` is a finite number > 0 (a caller, or a config file, may pass anything;
    ``True`` is not a number of seconds)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
