"""Dataset loading for built-in environments: bundled samples or the Hugging Face hub (lazily).

``dataset="bundled"`` reads a small made-up sample shipped in ``envs/data`` (no network);
anything else is a hub dataset name loaded with ``datasets`` (extra ``datasets``). The original's
kwargs ``dataset_name``/``dataset_subset``/``dataset_split`` are accepted as aliases of
``dataset``/``subset``/``split`` (see :class:`DatasetAliases`), so original configs pick the
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


class DatasetAliases:
    """Mixin for environments with ``dataset``/``subset``/``split`` attributes: also accepts the
    original's kwargs ``dataset_name``/``dataset_subset``/``dataset_split`` (put it first in the bases)."""

    def __init__(
        self,
        *args: Any,
        dataset_name: str | None = None,
        dataset_subset: str | None = None,
        dataset_split: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if dataset_name:
            self.dataset = dataset_name
        if dataset_subset:
            self.subset = dataset_subset
        if dataset_split:
            self.split = dataset_split


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
