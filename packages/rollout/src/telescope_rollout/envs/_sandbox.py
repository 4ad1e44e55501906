"""The sandbox protocol: how environments that run code receive an executor.

Environments never import ``telescope_sandbox``; the composition root hands them any object with
this shape (a telescope-sandbox pool, a remote service, or a test fake).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


@runtime_checkable
class CommandResultLike(RunResultLike, Protocol):
    """What one sandboxed command returns: a run's result and the files it was asked to send back."""

    files: Mapping[str, bytes]


@runtime_checkable
class CommandSandboxLike(Protocol):
    """Runs a command in isolation (telescope-sandbox's pool has this shape). ``forward_ports``
    makes a host Unix socket reachable at ``127.0.0.1:<port>`` inside, and nothing else."""

    async def run_command(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        files_out: Sequence[str] = (),
        forward_ports: Mapping[int, str] | None = None,
    ) -> CommandResultLike: ...


@dataclass
class RunResult:
    """A plain :class:`RunResultLike`, handy for fakes and adapters."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0
