"""Dataset loading for built-in environments: bundled samples or the Hugging Face hub (lazily).

``dataset="bundled"`` reads a small made-up sample shipped in ``envs/data`` (no network);
anything else is a hub dataset name loaded with ``datasets`` (extra ``datasets``). The original's
kwargs ``dataset_name``/``dataset_subset``/``dataset_split`` are accepted as aliases of
``dataset``/``subset``/``split`` (see :func:`apply_dataset_kwargs`), so original configs pick the
same data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
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


def apply_dataset_kwargs(
    env: Any,
    dataset_name: str | None = None,
    dataset_subset: str | None = None,
    dataset_split: str | None = None,
) -> None:
    """Set ``env.dataset``/``subset``/``split`` from the original's kwarg names when given."""
    if dataset_name:
        env.dataset = dataset_name
    if dataset_subset:
        env.subset = dataset_subset
    if dataset_split:
        env.split = dataset_split


def take(rows: Iterable[dict[str, Any]], num_samples: int) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if 0 <= num_samples <= len(out):
            break
        out.append(dict(row))
    return out


def take_samples(
    rows: Iterable[dict[str, Any]], row_to_sample: Callable[[dict[str, Any]], Any], num_samples: int
) -> list[Any]:
    """Map rows to samples, skipping rows the mapper rejects (``None``), up to ``num_samples``."""
    out = []
    for row in rows:
        if 0 <= num_samples <= len(out):
            break
        sample = row_to_sample(dict(row))
        if sample is not None:
            out.append(sample)
    return out
