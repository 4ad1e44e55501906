"""The provider interface every sandbox implements, and the validated request it executes.

A ``Sandbox`` is something that runs programs: ``run`` (source code in a language) and
``run_command`` (an argv) both build an ``ExecRequest`` and hand it to the provider's one
abstract method, ``_execute``. Providers differ in what a sandbox *is*: the local provider is
stateless (each run gets a fresh namespace and work directory, so one object serves any number
of concurrent runs), while a remote provider's object is one remote machine whose files persist
between runs. ``stateless`` tells the pool which kind it holds.

Paths in ``files`` and ``files_out`` are relative to the work directory; absolute paths and
``..`` are bad requests.

``forward_ports`` (providers with ``forwards_ports``: the local one) makes a host service reachable
from inside and nothing else: for each ``port: socket path``, the program can connect to
``127.0.0.1:port`` in its own network namespace and reaches the host's Unix socket at that path.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Self, TypeGuard, cast

from telescope_sandbox._errors import SandboxRequestError
from telescope_sandbox._limits import Limits
from telescope_sandbox._result import ExecResult

__all__ = ["LANGUAGES", "ExecRequest", "Sandbox", "check_relative_path"]

LANGUAGES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        # language: (file the code is written to, interpreter; "python" means the provider's Python)
        "python": ("main.py", "python"),
        "bash": ("main.sh", "bash"),
        "sh": ("main.sh", "sh"),
    }
)
"""Languages ``run`` understands: the file the code goes to and the interpreter that runs it."""


def check_relative_path(path: object) -> str:
    """Normalise a work-directory path; reject absolute paths, ``..`` and empty names."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SandboxRequestError(f"file path must be a non-empty string, got {path!r}")
    if path.startswith("/"):
        raise SandboxRequestError(f"file path {path!r} must be relative to the work directory")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        raise SandboxRequestError(f"file path {path!r} leaves the work directory")
    return norm


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One program to run: argv, stdin, environment, files in and out, limits. Validated on creation."""

    argv: tuple[str, ...]
    stdin: bytes = b""
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    files: Mapping[str, bytes] = field(default_factory=dict[str, bytes])
    files_out: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    forward_ports: Mapping[int, str] = field(default_factory=dict[int, str])
    """``127.0.0.1:port`` inside -> the host's Unix socket at this absolute path (module docstring)."""

    def __post_init__(self) -> None:
        # The fields' types say what a caller should pass; what it did pass is checked here.
        argv = cast("tuple[object, ...]", self.argv)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise SandboxRequestError(
                f"argv must be a non-empty list of strings without NUL, got {self.argv!r}"
            )
        if not isinstance(cast(object, self.stdin), bytes):
            raise SandboxRequestError("stdin must be str or bytes")
        for key, value in cast("Mapping[object, object]", self.env).items():
            if not (isinstance(key, str) and isinstance(value, str)) or not key or "=" in key:
                raise SandboxRequestError(f"bad environment variable {key!r}={value!r}")
            if "\0" in key or "\0" in value:
                raise SandboxRequestError(f"environment variable {key!r} contains NUL")
        files: dict[str, bytes] = {}
        for path, content in cast("Mapping[str, object]", self.files).items():
            if not _bytes_like(content):
                raise SandboxRequestError(f"content of {path!r} must be bytes or str")
            files[check_relative_path(path)] = bytes(content)
        object.__setattr__(self, "files", MappingProxyType(files))
        object.__setattr__(self, "files_out", tuple(check_relative_path(p) for p in self.files_out))
        size = sum(len(c) for c in files.values())
        if size > self.limits.disk_mb << 20:
            raise SandboxRequestError(f"files total {size} bytes, more than disk_mb={self.limits.disk_mb}")
        if any(len(c) > self.limits.max_file_mb << 20 for c in files.values()):
            raise SandboxRequestError(f"a file is larger than max_file_mb={self.limits.max_file_mb}")
        object.__setattr__(self, "forward_ports", MappingProxyType(_check_forwards(self.forward_ports)))


def _check_forwards(forwards: Mapping[int, str]) -> dict[int, str]:
    """``forward_ports`` checked: ports 1024-65535, each to an existing absolute socket path."""
    out: dict[int, str] = {}
    for port, path in cast("Mapping[object, object]", forwards).items():
        if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
            raise SandboxRequestError(f"forward_ports: port {port!r} must be an int from 1024 to 65535")
        if not isinstance(path, str) or not posixpath.isabs(path) or not stat.S_ISSOCK(_mode(path)):
            raise SandboxRequestError(
                f"forward_ports: {path!r} (port {port}) is not the path of a Unix socket"
            )
        out[port] = path
    return out


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _bytes_like(value: object) -> TypeGuard[bytes | bytearray | memoryview]:
    """Whether ``value`` is bytes, a bytearray or a memoryview (what ``bytes(value)`` copies)."""
    return isinstance(value, bytes | bytearray | memoryview)


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if _bytes_like(data):
        return bytes(data)
    raise SandboxRequestError(f"{what} must be str or bytes, got {type(data).__name__}")


class Sandbox(abc.ABC):
    """A place to run untrusted programs. Use as ``async with``; ``close`` releases it.

    Subclasses implement ``_execute``; ``run`` and ``run_command`` are shared.
    """

    name: ClassVar[str] = "sandbox"
    """The provider's registry name."""
    stateless: ClassVar[bool] = False
    """True when runs share nothing (one object may serve concurrent runs)."""
    forwards_ports: ClassVar[bool] = False
    """True when ``run_command`` takes ``forward_ports`` (a host socket reachable from inside)."""

    def __init__(self, *, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        """Defaults for every limit except ``timeout_s`` and ``memory_mb`` (those are per call)."""
        self.closed = False

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        stdin: str | bytes = "",
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        files_out: Sequence[str] = (),
        limits: Limits | None = None,
        forward_ports: Mapping[int, str] | None = None,
    ) -> ExecResult:
        """Run ``code`` written in ``language`` (``python``, ``bash`` or ``sh``) and return its result.

        The code is saved as ``main.py`` / ``main.sh`` in the work directory and run there with
        ``args``. ``files`` are written to the work directory first; ``files_out`` are read back
        into ``ExecResult.files``. ``limits`` sets every limit other than ``timeout_s`` and
        ``memory_mb``, which always come from their own arguments. ``forward_ports``: see the
        module docstring. Never raises for what the
        program does (see ``ExecResult.killed_by``); raises ``SandboxRequestError`` for a bad
        request and ``SandboxInfraError`` when the sandbox itself fails.
        """
        if language not in LANGUAGES:
            raise SandboxRequestError(f"unknown language {language!r}; known: {', '.join(LANGUAGES)}")
        if not isinstance(cast(object, code), str):
            raise SandboxRequestError("code must be a string")
        filename, interpreter = LANGUAGES[language]
        all_files = dict(files or {})
        if filename in all_files:
            raise SandboxRequestError(f"files may not contain {filename!r}: the code is written there")
        all_files[filename] = code
        argv = [self._interpreter(interpreter), filename, *args]
        return await self.run_command(
            argv,
            stdin=stdin,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            env=env,
            files=all_files,
            files_out=files_out,
            limits=limits,
            forward_ports=forward_ports,
        )

    async def run_command(
        self,
        argv: Sequence[str],
        *,
        stdin: str | bytes = "",
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        files_out: Sequence[str] = (),
        limits: Limits | None = None,
        forward_ports: Mapping[int, str] | None = None,
    ) -> ExecResult:
        """Run ``argv`` (looked up on the sandbox's ``PATH``) in the work directory; as ``run``.
        ``forward_ports``: see the module docstring (``SandboxRequestError`` where the provider
        cannot)."""
        if self.closed:
            raise SandboxRequestError(f"{type(self).__name__} is closed")
        if forward_ports and not self.forwards_ports:
            raise SandboxRequestError(
                f"the {self.name!r} sandbox cannot reach a host socket (forward_ports); use provider 'local'"
            )
        if isinstance(argv, str):
            raise SandboxRequestError("argv must be a list of strings, not one string")
        base = limits or self.limits
        request = ExecRequest(
            argv=tuple(argv),
            stdin=_as_bytes(stdin, "stdin"),
            env=dict(env or {}),
            files={
                path: _as_bytes(content, f"content of {path!r}") for path, content in (files or {}).items()
            },
            files_out=tuple(files_out),
            limits=dataclasses.replace(base, timeout_s=timeout_s, memory_mb=memory_mb),
            forward_ports=dict(forward_ports or {}),
        )
        return await self._execute(request)

    def _interpreter(self, name: str) -> str:
        """The command for interpreter ``name``; providers map ``"python"`` to their Python."""
        return "python3" if name == "python" else name

    @abc.abstractmethod
    async def _execute(self, request: ExecRequest) -> ExecResult:
        """Run one validated request."""

    async def close(self) -> None:
        """Release the sandbox; later runs raise ``SandboxRequestError``."""
        self.closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
