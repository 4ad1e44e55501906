"""megatron-core is the optional ``[megatron]`` extra: a clear ImportError when it is missing.

Importing ``telescope_trainer_megatron`` never needs it (``convert_checkpoint`` runs in a plain
process); building a trainer, installing the CPU shim or importing the modules built on
megatron-core's classes does, and :func:`require_megatron` turns the bare ``ModuleNotFoundError``
into one that says how to install it.
"""

from __future__ import annotations

import importlib

__all__ = ["MEGATRON_INSTALL", "require_megatron"]

MEGATRON_INSTALL = "pip install 'telescope-trainer-megatron[megatron]'"
"""The command that installs the extra (megatron-core at the version this backend is tested with)."""


def require_megatron() -> None:
    """Raise an ImportError naming the ``[megatron]`` extra when megatron-core cannot be imported."""
    try:
        importlib.import_module("megatron.core")
    except ImportError as exc:
        raise ImportError(
            f"the Megatron training backend needs megatron-core, which is not installed ({exc}); "
            f"install the extra: {MEGATRON_INSTALL}"
        ) from exc
