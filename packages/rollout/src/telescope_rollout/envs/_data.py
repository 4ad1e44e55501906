"""Dataset loading for built-in environments: bundled samples or the Hugging Face hub (lazily).

``dataset="bundled"`` reads a small made-up sample shipped in ``envs/data`` (no network);
anything else is a hub dataset name loaded with ``datasets`` (extra ``datasets``).
:class:`HubDatasetEnv` is the base of the built-ins that read one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any, ClassVar, cast

from telescope_rollout._types import Sample
from telescope_rollout.envs._env import SingleTurnEnvironment

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
    hub: Any = datasets  # partly typed
    loaded = hub.load_dataset(name, subset, split=split)  # a Dataset: an iterable of row dicts
    return cast("Iterable[dict[str, Any]]", loaded)


class HubDatasetEnv(SingleTurnEnvironment):
    """A single-turn environment over a hub dataset (``dataset``, ``subset``, ``split``) or, with
    ``dataset="bundled"``, over its small offline sample ``envs/data/<bundled_file>``.

    Subclasses name the dataset and map one row with :meth:`row_to_sample` (None skips the row);
    bundled rows go through :meth:`bundled_row_to_sample` (by default the same mapping). The kwargs
    ``dataset_name``/``dataset_subset``/``dataset_split`` are accepted as aliases, as configs
    written for INTELLECT-3's environments spell them.
    """

    optional: ClassVar[tuple[str, ...]] = ("datasets",)
    dataset: str = ""
    subset: str | None = None
    split: str = "train"
    bundled_file: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        dataset_name: str | None = None,
        dataset_subset: str | None = None,
        dataset_split: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if dataset_name:
            self.dataset = dataset_name
        if dataset_subset:
            self.subset = dataset_subset
        if dataset_split:
            self.split = dataset_split

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        raise NotImplementedError

    def bundled_row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        return self.row_to_sample(row)

    def hub_rows(self) -> Iterable[dict[str, Any]]:
        return hub_rows(self.dataset, self.subset, self.split)

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        if self.dataset == BUNDLED:
            if not self.bundled_file:
                raise ValueError(f"{self.name} has no bundled sample: name a hub dataset")
            rows, to_sample = bundled_rows(self.bundled_file), self.bundled_row_to_sample
        else:
            rows, to_sample = self.hub_rows(), self.row_to_sample
        return self._set_samples(take_samples(rows, to_sample, num_samples), num_samples)


def take_samples(
    rows: Iterable[dict[str, Any]], row_to_sample: Callable[[dict[str, Any]], Any], num_samples: int
) -> list[Any]:
    """Map rows to samples, skipping rows the mapper rejects (``None``), up to ``num_samples``."""
    out: list[Any] = []
    for row in rows:
        if 0 <= num_samples <= len(out):
            break
        sample = row_to_sample(dict(row))
        if sample is not None:
            out.append(sample)
    return out
