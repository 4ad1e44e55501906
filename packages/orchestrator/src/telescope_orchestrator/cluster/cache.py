"""Telescope's own cache directory on this machine (converted models, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """Telescope's own cache: ``$TELESCOPE_CACHE`` or ``~/.cache/telescope``."""
    return Path(os.environ.get("TELESCOPE_CACHE") or Path.home() / ".cache" / "telescope")
