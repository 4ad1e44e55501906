"""The sandbox protocol: how environments that run code receive an executor.

Environments never import ``telescope_sandbox``; the composition root hands them any object with
this shape (a telescope-sandbox pool, a remote service, or a test fake).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class RunResultLike(Protocol):
    """What one sandboxed run returns."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_s: float


@runtime_checkable
class SandboxLike(Protocol):
    """Runs a program in isolation and reports its output; never raises for the program's errors."""

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        stdin: str = "",
        timeout_s: float = 10.0,
        memory_mb: int = 512,
    ) -> RunResultLike: ...


@dataclass
class RunResult:
    """A plain :class:`RunResultLike`, handy for fakes and adapters."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0
