"""Reading and writing Hugging Face ``*.safetensors`` checkpoints, one tensor at a time.

:class:`HFCheckpoint` opens a model folder (a single ``model.safetensors`` or shards with
``model.safetensors.index.json``) and reads tensors lazily, so a rank loads only what it holds.
:func:`save_hf_weights` writes ``(name, tensor)`` pairs as shards of at most ``shard_bytes``
plus the index, the layout ``from_pretrained`` and vLLM read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType] (bare PathLike)

__all__ = ["HFCheckpoint", "save_hf_weights"]

_INDEX = "model.safetensors.index.json"


class _SafetensorsFile(Protocol):
    """What this module uses of an open ``safe_open`` handle (the stub leaves ``__enter__`` untyped)."""

    def keys(self) -> list[str]: ...

    def get_tensor(self, name: str) -> torch.Tensor: ...


def _open(path: Path) -> AbstractContextManager[_SafetensorsFile]:
    return cast(AbstractContextManager[_SafetensorsFile], safe_open(path, "pt"))


class HFCheckpoint:
    """Lazy tensor access to the safetensors files of a local Hugging Face model folder."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        index = self.dir / _INDEX
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            self._files: dict[str, Path] = {name: self.dir / f for name, f in weight_map.items()}
        elif (self.dir / "model.safetensors").is_file():
            with _open(self.dir / "model.safetensors") as f:
                self._files = dict.fromkeys(f.keys(), self.dir / "model.safetensors")
        else:
            raise FileNotFoundError(
                f"no model.safetensors or {_INDEX} in {self.dir}: the Megatron backend loads safetensors "
                "weights (convert .bin checkpoints with transformers' save_pretrained first)"
            )

    def keys(self) -> list[str]:
        return list(self._files)

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def get(self, name: str) -> torch.Tensor:
        try:
            path = self._files[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in the checkpoint at {self.dir}") from None
        with _open(path) as f:
            return f.get_tensor(name)


def save_hf_weights(
    weights: Iterable[tuple[str, torch.Tensor]], out_dir: str | Path, *, shard_bytes: int = 5 * 2**30
) -> list[Path]:
    """Write ``weights`` as ``model.safetensors`` (or numbered shards plus an index); return the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().to("cpu").contiguous()
        size += nbytes
    if len(shards) == 1:
        path = out / "model.safetensors"
        save_file(shards[0], str(path), metadata={"format": "pt"})
        return [path]
    paths: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        path = out / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, path.name))
        paths.append(path)
    total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
    (out / _INDEX).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    return paths
