"""One rank's share of a global Megatron tensor, and the way back (tensor, pipeline, expert).

Pure functions over global names (see :mod:`telescope_trainer_megatron._convert`):

* **Tensor parallel** (:func:`tp_split_dim`, :func:`tp_shard`, :func:`tp_merge`): column-parallel
  weights (embedding, output layer, ``linear_qkv``) are split on rows, row-parallel weights
  (``linear_proj``, ``linear_fc2``) on columns. A SwiGLU ``linear_fc1`` is ``[gate; up]``; each rank
  holds ``[gate_r; up_r]``, so both halves are split separately. Norms, routers and the shared-expert
  gate are replicated. Routed experts are not split (``expert_tensor_parallel_size`` is 1).
* **Pipeline and expert parallel** (:func:`to_global_name`, :func:`to_local_name`): a stage numbers
  its layers from 0, an expert-parallel rank its experts from 0; the offsets map them back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import torch

__all__ = ["to_global_name", "to_local_name", "tp_merge", "tp_shard", "tp_split_dim"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")
_COLUMN = ("linear_qkv.weight", "linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight", "shared_experts.linear_fc2.weight")
_GATED = ("mlp.linear_fc1.weight", "shared_experts.linear_fc1.weight")
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")

Split = Literal["gated"] | int | None


def tp_split_dim(name: str) -> Split:
    """How a global tensor is split over tensor-parallel ranks: 0, 1, ``"gated"`` or None."""
    if ".local_experts." in name:
        return None
    if name in _VOCAB or name.endswith(_COLUMN):
        return 0
    if name.endswith(_GATED):
        return "gated"
    if name.endswith(_ROW):
        return 1
    return None


def tp_shard(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s shard (a view where possible) of the global tensor ``name``."""
    split = tp_split_dim(name)
    if size == 1 or split is None:
        return tensor
    if split == "gated":
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    if tensor.shape[split] % size:
        raise ValueError(f"{name}: dimension {split} of {tuple(tensor.shape)} is not divisible by TP={size}")
    return tensor.chunk(size, dim=split)[rank]


def tp_merge(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`tp_shard`: the global tensor from every rank's shard, in rank order."""
    split = tp_split_dim(name)
    if len(shards) == 1 or split is None:
        return shards[0]
    if split == "gated":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(list(shards), dim=split)


def _shift(pattern: re.Pattern[str], name: str, offset: int, template: str) -> str:
    return pattern.sub(lambda m: template.format(int(m.group(1)) + offset), name, count=1)


def to_global_name(local: str, *, layer_offset: int = 0, expert_offset: int = 0) -> str:
    """A rank's parameter name with global layer and expert indices."""
    name = _shift(_LAYER, local, layer_offset, "decoder.layers.{}.")
    return _shift(_EXPERT, name, expert_offset, ".local_experts.{}.")


def to_local_name(
    name: str, *, layer_offset: int, num_layers: int, expert_offset: int = 0, num_experts: int = 0
) -> str | None:
    """The rank-local name of a global parameter, or None when this rank does not hold it."""
    local = _to_local(_LAYER, name, layer_offset, num_layers, "decoder.layers.{}.")
    if local is None:
        return None
    return _to_local(_EXPERT, local, expert_offset, num_experts, ".local_experts.{}.")


def _to_local(pattern: re.Pattern[str], name: str, offset: int, count: int, template: str) -> str | None:
    """``name`` with the index ``pattern`` captures shifted down by ``offset``; None when the shifted
    index is outside ``0 … count-1`` (another rank's); ``name`` itself when it has no such index."""
    m = pattern.search(name)
    if m is None:
        return name
    if not 0 <= int(m.group(1)) - offset < count:
        return None
    return _shift(pattern, name, -offset, template)
