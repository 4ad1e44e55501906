"""telescope-sandbox: isolated, asynchronous execution of untrusted, model-written programs.

``LocalSandbox`` runs programs on this machine in bubblewrap namespaces with rlimits;
``E2BSandbox``, ``ModalSandbox`` and ``DaytonaSandbox`` adapt remote services (extras);
``SandboxPool`` bounds concurrency and reuses sandboxes; ``get_sandbox`` finds a provider by
name in the ``telescope.sandboxes`` entry-point group. Every run returns an ``ExecResult``.
"""

from telescope_sandbox.__about__ import __version__
from telescope_sandbox._errors import (
    SandboxCPULimitError,
    SandboxDiskLimitError,
    SandboxError,
    SandboxInfraError,
    SandboxLimitError,
    SandboxMemoryError,
    SandboxOutputLimitError,
    SandboxProviderDownError,
    SandboxRequestError,
    SandboxTimeoutError,
    SandboxUnavailableError,
)
from telescope_sandbox._limits import Limits
from telescope_sandbox._local import LocalSandbox
from telescope_sandbox._pool import SandboxPool
from telescope_sandbox._provider import ExecRequest, Sandbox
from telescope_sandbox._registry import available_sandboxes, get_sandbox
from telescope_sandbox._remote import DaytonaSandbox, E2BSandbox, ModalSandbox, RemoteSandbox
from telescope_sandbox._result import ExecResult

__all__ = [
    # Providers
    "DaytonaSandbox",
    "E2BSandbox",
    "LocalSandbox",
    "ModalSandbox",
    "RemoteSandbox",
    "Sandbox",
    "available_sandboxes",
    "get_sandbox",
    # Running programs
    "ExecRequest",
    "ExecResult",
    "Limits",
    "SandboxPool",
    # Errors the sandbox raises: the base class, a bad request, a failed sandbox
    "SandboxError",
    "SandboxInfraError",
    "SandboxProviderDownError",
    "SandboxRequestError",
    "SandboxUnavailableError",
    # Errors for a program stopped by a limit (ExecResult.raise_for_limit)
    "SandboxLimitError",
    "SandboxCPULimitError",
    "SandboxDiskLimitError",
    "SandboxMemoryError",
    "SandboxOutputLimitError",
    "SandboxTimeoutError",
    # Package
    "__version__",
]
