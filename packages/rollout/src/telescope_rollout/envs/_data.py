"""Dataset loading for built-in environments: bundled samples or the Hugging Face hub (lazily).

``dataset="bundled"`` reads a small made-up sample shipped in ``envs/data`` (no network);
anything else is a hub dataset name loaded with ``datasets`` (extra ``datasets``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

BUNDLED = "bundled"


def bundled_rows(filename: str) -> list[dict[str, Any]]:
    """Rows of ``envs/data/<filename>`` (JSON lines)."""
    text = resources.files("telescope_rollout.envs").joinpath("data", filename).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def hub_rows(name: str, subset: str | None = None, split: str = "train") -> Iterable[dict[str, Any]]:
    """Rows of a hub dataset; the ImportError names the extra to install."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading the hub dataset {name!r} needs `datasets`: pip install 'telescope-rollout[datasets]'"
            " (or pass dataset='bundled' for the small offline sample)"
        ) from exc
    return datasets.load_dataset(name, subset, split=split)


def take(rows: Iterable[dict[str, Any]], num_samples: int) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if 0 <= num_samples <= len(out):
            break
        out.append(dict(row))
    return out
