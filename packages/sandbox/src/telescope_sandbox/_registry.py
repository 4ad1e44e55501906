"""Finding sandbox providers by name through the ``telescope.sandboxes`` entry-point group.

This package registers ``local`` (``LocalSandbox``) and the remote adapters ``e2b``, ``modal``
and ``daytona`` (their SDKs are extras); any installed distribution can add more under the same
group. An unknown name is an error that lists the known ones.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from telescope_sandbox._errors import SandboxRequestError
from telescope_sandbox._provider import Sandbox

__all__ = ["ENTRY_POINT_GROUP", "available_sandboxes", "get_sandbox"]

ENTRY_POINT_GROUP = "telescope.sandboxes"


def available_sandboxes() -> list[str]:
    """Names registered under ``telescope.sandboxes``, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def get_sandbox(name: str, **kwargs: Any) -> Sandbox:
    """Build the sandbox registered as ``name`` with ``kwargs`` (``get_sandbox("local")``)."""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        known = ", ".join(available_sandboxes()) or "none"
        raise SandboxRequestError(f"unknown sandbox provider {name!r}; known: {known}")
    provider = matches[0].load()
    sandbox = provider(**kwargs)
    if not isinstance(sandbox, Sandbox):
        raise SandboxRequestError(f"entry point {name!r} made {type(sandbox).__name__}, not a Sandbox")
    return sandbox
