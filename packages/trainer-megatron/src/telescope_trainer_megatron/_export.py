"""Gathering the model into Hugging Face tensors for weight sync and checkpoints (collective).

For each global Megatron parameter, in model order: the ranks that hold it all-gather their
tensor-parallel shards and merge them (:func:`~telescope_trainer_megatron._shard.tp_merge`); when
some ranks do not hold it (another pipeline stage, another expert-parallel rank) the lowest holder
broadcasts it to the world. The global tensor is then converted to its Hugging Face tensors. Every
rank yields the same complete tensors, one parameter at a time, so the whole model is never held
twice. Who holds what is exchanged once (:func:`export_plan`) and cached by the trainer.

``free_grad_buffers`` releases the storage of the data-parallel gradient buffers for the length
of the export (they are zero between steps) and restores it, zeroed, when the iterator ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from telescope_trainer_megatron._arch import Architecture
from telescope_trainer_megatron._convert import megatron_names, megatron_tensor_to_hf
from telescope_trainer_megatron._shard import tp_merge, tp_split_dim

__all__ = ["ExportPlan", "export_plan", "iter_hf_weights"]


@dataclass(frozen=True)
class ExportPlan:
    """Per global name: merged shape, dtype, and the broadcasting rank (None: every rank holds it)."""

    entries: list[tuple[str, tuple[int, ...], torch.dtype, int | None]]


def _merged_shape(name: str, shape: torch.Size, tp: int) -> tuple[int, ...]:
    split = tp_split_dim(name)
    out = list(shape)
    if split is not None and tp > 1:
        out[0 if split == "gated" else int(split)] *= tp
    return tuple(out)


def export_plan(params: Mapping[str, torch.Tensor], arch: Architecture, tp: int) -> ExportPlan:
    """Exchange which rank holds which global parameter (collective over the world)."""
    mine = {name: (_merged_shape(name, p.shape, tp), p.dtype) for name, p in params.items()}
    everyone: list[Any] = [None] * dist.get_world_size()  # every rank's `mine`, once gathered
    dist.all_gather_object(everyone, mine)  # pyright: ignore[reportUnknownMemberType] (untyped parameters)
    entries: list[tuple[str, tuple[int, ...], torch.dtype, int | None]] = []
    for name in megatron_names(arch):
        holders = [r for r, held in enumerate(everyone) if name in held]
        if not holders:
            raise RuntimeError(f"no rank holds {name}: the model and the conversion disagree")
        shape, dtype = everyone[holders[0]][name]
        src = None if len(holders) == len(everyone) else holders[0]
        entries.append((name, shape, dtype, src))
    return ExportPlan(entries)


def _grad_buffers(ddp_model: Any) -> list[Any]:
    return list(getattr(ddp_model, "buffers", [])) + list(getattr(ddp_model, "expert_parallel_buffers", []))


def iter_hf_weights(
    params: Mapping[str, torch.Tensor],
    plan: ExportPlan,
    arch: Architecture,
    *,
    tp_group: dist.ProcessGroup | None,
    ddp_model: Any = None,
    free_grad_buffers: bool = False,
    cpu_staging: bool = False,
    pin_memory: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face ``(name, tensor)`` pairs of the whole model (module docstring); collective.

    Args:
        params: this rank's parameters by *global* Megatron name (tensor-parallel shards).
        plan: from :func:`export_plan`.
        tp_group: the tensor-parallel group (None or size 1: nothing to gather).
    """
    tp = dist.get_world_size(tp_group) if tp_group is not None else 1
    freed: list[tuple[Any, int]] = []
    if free_grad_buffers and ddp_model is not None:
        for buf in _grad_buffers(ddp_model):
            storage = buf.grad_data.untyped_storage()
            if storage.size() > 0:
                freed.append((buf, storage.size()))
                storage.resize_(0)
    try:
        for name, shape, dtype, src in plan.entries:
            held = params.get(name)
            if held is not None:
                full = held.detach()
                if tp > 1 and tp_split_dim(name) is not None:
                    shards = [torch.empty_like(full) for _ in range(tp)]
                    dist.all_gather(  # pyright: ignore[reportUnknownMemberType] (untyped tensor lists)
                        shards, full.contiguous(), group=tp_group
                    )
                    full = tp_merge(name, shards)
            else:
                full = torch.empty(shape, dtype=dtype, device=_device())
            if src is not None:
                full = full.contiguous()
                dist.broadcast(full, src=src)
            if cpu_staging and full.device.type != "cpu":
                full = full.to("cpu").pin_memory() if pin_memory else full.to("cpu")
            yield from megatron_tensor_to_hf(name, full, arch)
    finally:
        for buf, size in freed:
            buf.grad_data.untyped_storage().resize_(size)
            buf.grad_data.zero_()


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
