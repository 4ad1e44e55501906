"""Context parallelism (``fsdp_context_parallel_size`` = cp > 1): every packed row split over cp ranks.

Layout: rank ``r`` is context-parallel rank ``r mod cp`` of data-parallel replica ``r // cp`` (a
``(dp, cp)`` mesh); the cp ranks of a replica get the same micro-batches, and FSDP still
shards the parameters over the whole world.

Per micro-batch (exact; the same computation as cp = 1 up to summation order):

1. The row is padded to a multiple of ``2·cp`` (``telescope_algos.pad_micro_batch`` with the
   trainer's ``row_multiple``: a padding segment without loss tokens) and each rank
   keeps its zig-zag chunks (``telescope_algos.backend.zigzag_indices``) with their *global* position ids,
   so the model's rotary embeddings are those of the whole row.
2. Attention is the ``telescope_cp`` implementation registered with transformers: keys and values
   are all-gathered over the cp group (``gather_partial``; the backward sums them back) and each
   local query attends causally within its own sample (``packed_attention``); no ``L × L`` mask.
3. Logits exist only for local positions; their log-probabilities and entropies are all-gathered
   to the whole row (``gather_replicated``), so every cp rank runs the unchanged
   ``telescope_algos.compute_loss``: GSPO's sequence ratio and every metric equal cp = 1. The
   zig-zag split gives every rank the same share of the causal attention (a contiguous split
   would leave most of it to the last rank).
4. Each rank's parameter gradient is the part that flows through its own tokens; the exact gradient
   is their sum, so the trainer scales the loss by the world size (FSDP averages over all ranks).

Plain torch (SDPA): it needs no flash-attn or ring attention kernels and runs wherever the trainer
runs, CPU included. The split and the gathers: docs/algorithms.md#context-parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist

from telescope_algos import MicroBatch, align_to_inputs, label_logprobs_and_entropy, next_token_labels
from telescope_algos.backend import (
    cu_seqlens,
    gather_partial,
    gather_replicated,
    packed_attention,
    zigzag_indices,
)
from telescope_trainer_fsdp._distributed import collectives

__all__ = ["ATTENTION", "CPLayout", "cp_logprobs", "make_layout", "register_attention"]

ATTENTION = "telescope_cp"
"""The name of the context-parallel attention in transformers' ``AttentionInterface``."""


@dataclass(frozen=True)
class CPLayout:
    """This rank's place in the (data parallel, context parallel) grid."""

    cp: int
    cp_rank: int
    dp_rank: int
    dp_world_size: int
    group: dist.ProcessGroup | None


def make_layout(cp: int) -> CPLayout:
    """Split the default process group into replicas of ``cp`` consecutive ranks (collective)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if cp < 1 or world % cp:
        raise ValueError(
            f"fsdp_context_parallel_size {cp} must divide the {world} trainer ranks; set "
            f"trainer_num_workers to a multiple of {cp}"
        )
    group: dist.ProcessGroup | None = None
    if cp > 1:
        for replica in range(world // cp):
            ranks = list(range(replica * cp, (replica + 1) * cp))
            # every rank creates every group, in the same order (new_group's annotation admits an int)
            made = cast(dist.ProcessGroup, collectives.new_group(ranks))
            if rank in ranks:
                group = made
    return CPLayout(cp=cp, cp_rank=rank % cp, dp_rank=rank // cp, dp_world_size=world // cp, group=group)


@dataclass(frozen=True)
class _Active:
    cu_seqlens: list[int]
    layout: CPLayout


_ACTIVE: dict[str, _Active] = {}
"""The micro-batch being run. It stays set after the forward: with gradient checkpointing the
backward runs the attention again."""


def _no_mask(*args: object, **kwargs: object) -> None:
    return None  # _cp_attention isolates samples itself


def _cp_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention: ``query [1, heads, s_local, d]``, ``key/value [1, kv_heads, s_local, d]``
    → ``[1, s_local, heads, d]``."""
    active = _ACTIVE.get("batch")
    if active is None:
        raise RuntimeError(
            f"the {ATTENTION!r} attention runs only inside the FSDP trainer's context-parallel forward"
        )
    if getattr(module, "sliding_window", None) or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            f"{type(module).__name__} uses sliding-window, soft-capped or sink attention, which FSDP context "
            "parallelism does not implement; set fsdp_context_parallel_size: 1"
        )
    if query.shape[0] != 1:
        raise ValueError(f"context parallelism runs one packed row at a time, got {query.shape[0]} rows")
    lo = active.layout
    k = gather_partial(key[0], 1, lo.group)
    v = gather_partial(value[0], 1, lo.group)
    out = packed_attention(
        query[0], k, v, active.cu_seqlens, cp=lo.cp, cp_rank=lo.cp_rank, scale=scaling, dropout=dropout
    )
    return out.transpose(0, 1).unsqueeze(0), None


def register_attention() -> None:
    """Register ``telescope_cp`` (and its no-op mask builder) with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    # register's value is annotated as a bare Callable: the interfaces are reached through Any
    cast(Any, AttentionInterface).register(ATTENTION, _cp_attention)
    cast(Any, AttentionMaskInterface).register(ATTENTION, _no_mask)


def cp_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    layout: CPLayout,
    *,
    device: torch.device,
    temperature: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-row ``(logprobs, entropy)`` (algos layout) of a row padded by ``pad_micro_batch``."""
    ids = mb.input_ids.to(device, non_blocking=True)
    positions = mb.position_ids.to(device, non_blocking=True)
    length = ids.shape[1]
    local = zigzag_indices(length, layout.cp, layout.cp_rank, device)
    _ACTIVE["batch"] = _Active(cu_seqlens=cu_seqlens(positions), layout=layout)
    logits = model(input_ids=ids[:, local], position_ids=positions[:, local], use_cache=False).logits
    lp, ent = label_logprobs_and_entropy(
        logits, next_token_labels(ids)[:, local], temperature=temperature, chunk_size=chunk_size
    )
    lp = gather_replicated(lp, 1, layout.group)
    ent = gather_replicated(ent, 1, layout.group)
    return align_to_inputs(lp), align_to_inputs(ent)
