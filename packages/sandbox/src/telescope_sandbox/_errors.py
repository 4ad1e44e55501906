"""The error taxonomy: what went wrong when running a program, as exception classes.

Two kinds of trouble are kept apart:

* The program hit a limit (timeout, CPU, memory, output, disk). ``run`` does **not** raise for
  these: it returns an ``ExecResult`` whose ``killed_by`` names the limit, because a reward
  function usually wants to score such a program, not crash. ``ExecResult.raise_for_limit()``
  turns that result into the matching ``SandboxLimitError`` subclass for callers who prefer
  exceptions.
* The sandbox could not do its job (``SandboxInfraError``: bubblewrap failed to set up, a remote
  API is down; ``SandboxUnavailableError``: the provider cannot work on this host at all) or the
  request was bad (``SandboxRequestError``: an unknown language, a path outside the work
  directory, a negative limit). These are raised.

```
SandboxError
├── SandboxRequestError (also ValueError)
├── SandboxInfraError
│   ├── SandboxUnavailableError
│   └── SandboxProviderDownError
└── SandboxLimitError            (.result holds the ExecResult)
    ├── SandboxTimeoutError
    │   └── SandboxCPULimitError
    ├── SandboxMemoryError
    ├── SandboxOutputLimitError
    └── SandboxDiskLimitError
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope_sandbox._result import ExecResult

__all__ = [
    "SandboxCPULimitError",
    "SandboxDiskLimitError",
    "SandboxError",
    "SandboxInfraError",
    "SandboxLimitError",
    "SandboxMemoryError",
    "SandboxOutputLimitError",
    "SandboxProviderDownError",
    "SandboxRequestError",
    "SandboxTimeoutError",
    "SandboxUnavailableError",
]


class SandboxError(Exception):
    """Base class of every error this package raises."""


class SandboxRequestError(SandboxError, ValueError):
    """The request itself is wrong (bad language, path, limit or argument); fix the call."""


class SandboxInfraError(SandboxError):
    """The sandbox failed, not the program: setup failed, a remote API is down, a pipe broke.

    Safe to retry on another sandbox; never a verdict on the program.
    """


class SandboxUnavailableError(SandboxInfraError):
    """The provider cannot run on this host (a tool is missing, namespaces are disabled).

    The message says what to install or change.
    """


class SandboxProviderDownError(SandboxInfraError):
    """A pool's provider failed so many runs in a row that runs now fail at once for a while
    (``SandboxPool``'s circuit breaker); the message has the last failure."""


class SandboxLimitError(SandboxError):
    """The program was stopped by a limit; ``result`` is what it left behind."""

    def __init__(self, message: str, result: ExecResult) -> None:
        super().__init__(message)
        self.result = result


class SandboxTimeoutError(SandboxLimitError):
    """The wall-clock limit (``timeout_s``) ran out; the whole process tree was killed."""


class SandboxCPULimitError(SandboxTimeoutError):
    """The CPU-time limit (``RLIMIT_CPU``) ran out before the wall-clock limit."""


class SandboxMemoryError(SandboxLimitError):
    """The program ran out of its memory limit (``RLIMIT_AS``)."""


class SandboxOutputLimitError(SandboxLimitError):
    """The program wrote far more than ``max_output_bytes`` and was killed for it."""


class SandboxDiskLimitError(SandboxLimitError):
    """The program hit the file-size limit or filled its size-limited work directory."""
