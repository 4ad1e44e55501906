"""Context parallelism (CP) for packed rows: the load-balanced split, the sequence all-gathers and the
per-rank packed attention, shared by both trainer backends.

A packed row of length ``L`` (a multiple of ``2·cp``) is cut into ``2·cp`` chunks of ``c = L/(2·cp)``
tokens; CP rank ``r`` holds chunks ``r`` and ``2·cp−1−r`` (Megatron's zig-zag convention, the one its
rotary embeddings use, see ``get_pos_emb_on_this_cp_rank``), so every rank has the same amount of
causal-attention work. Example, ``L = 8``, ``cp = 2``: rank 0 holds positions ``[0, 1, 6, 7]``, rank 1
``[2, 3, 4, 5]``.

Two autograd-aware all-gathers put the local pieces back in global order:

* :func:`gather_partial` for keys and values: every rank's *own* queries use the gathered tensor, so
  the gradient of the full tensor is a sum over ranks; the backward is a reduce-scatter.
* :func:`gather_replicated` for per-token log-probabilities and entropies: every rank then runs the
  *same* loss on the full row, so each rank's gradient of the full tensor is already the whole one,
  and the backward keeps this rank's slice (no communication). Summing parameter gradients over the
  CP ranks (Megatron's DDP reduces over data × context parallel ranks; the FSDP trainer scales its
  loss so that FSDP's average becomes that sum) then gives the exact gradient.

:func:`packed_attention` is the per-sample causal attention of one rank's queries against the
gathered keys (Megatron's ``PackedDotProductAttention``, the FSDP trainer's CP attention).

Everything here is exact: no approximation against the CP = 1 computation beyond summation order.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right  # pyright: ignore[reportUnknownVariableType]

from telescope_algos._segments import find_segments


def _check(length: int, cp: int, rank: int | None = None) -> None:
    if cp < 1:
        raise ValueError(f"context parallel size must be >= 1, got {cp}")
    if length % (2 * cp) and cp > 1:
        raise ValueError(
            f"a row of {length} tokens cannot be split over {cp} context-parallel ranks: its length must be "
            f"a multiple of 2 x {cp} = {2 * cp} (pad the row)"
        )
    if rank is not None and not 0 <= rank < cp:
        raise ValueError(f"context-parallel rank {rank} is outside 0..{cp - 1}")


def split_length(length: int, cp: int) -> int:
    """Smallest length ≥ ``length`` that splits evenly: a multiple of ``2·cp`` (``length`` when cp = 1)."""
    if cp <= 1:
        return length
    return -(-length // (2 * cp)) * 2 * cp


def cu_seqlens(position_ids: torch.Tensor) -> list[int]:
    """Sample boundaries ``[0, s_1, …, L]`` of one packed row ``[1, L]`` whose positions restart at 0
    per sample (the first token always opens one)."""
    starts = find_segments(position_ids.shape, position_ids=position_ids).starts[0]
    return [*(int(i) for i in torch.nonzero(starts).squeeze(1)), position_ids.shape[1]]


def chunk_bounds(length: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """The global ``[start, end)`` ranges rank ``rank`` holds, in its local order.

    ``cp = 1``: ``[(0, length)]``. Otherwise chunks ``rank`` and ``2·cp−1−rank`` of size ``length/(2·cp)``.
    """
    _check(length, cp, rank)
    if cp == 1:
        return [(0, length)]
    c = length // (2 * cp)
    return [(rank * c, (rank + 1) * c), ((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def zigzag_indices(length: int, cp: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """Global positions held by ``rank``, in local order (long tensor of ``length / cp``)."""
    return torch.cat([torch.arange(s, e, device=device) for s, e in chunk_bounds(length, cp, rank)])


def gather_order(length: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    """Global position of every element of the rank-ordered concatenation of the local pieces.

    ``torch.cat([local_0, …, local_{cp−1}])[j]`` is the token at global position ``gather_order[j]``.
    """
    return torch.cat([zigzag_indices(length, cp, r, device) for r in range(cp)])


def _all_gather_seq(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Rank-ordered concatenation of every rank's ``x`` along ``dim`` (contiguous copies)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)  # pyright: ignore[reportUnknownMemberType]
    return torch.cat(parts, dim=dim)


def _to_global(gathered: torch.Tensor, order: torch.Tensor, dim: int) -> torch.Tensor:
    """``gathered`` (rank order) with element j moved to global position ``order[j]`` along ``dim``."""
    return torch.empty_like(gathered).index_copy_(dim, order, gathered)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, dim: int, group: dist.ProcessGroup | None, replicated: bool
    ) -> torch.Tensor:
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        length = x.shape[dim] * cp
        order = gather_order(length, cp, x.device)
        ctx.dim, ctx.group, ctx.replicated, ctx.rank, ctx.local = dim, group, replicated, rank, x.shape[dim]
        ctx.save_for_backward(order)
        return _to_global(_all_gather_seq(x, dim, group), order, dim)

    @staticmethod
    def backward(  # pyright: ignore[reportIncompatibleMethodOverride] (one named gradient)
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        (order,) = ctx.saved_tensors
        dim = ctx.dim
        in_rank_order = grad.index_select(dim, order)  # the gradient of the gathered concatenation
        if ctx.replicated:
            mine = in_rank_order.narrow(dim, ctx.rank * ctx.local, ctx.local)
            return mine.contiguous(), None, None, None
        moved = in_rank_order.movedim(dim, 0).contiguous()
        out = moved.new_empty((ctx.local, *moved.shape[1:]))
        # torch 2.13's name of reduce_scatter_tensor; its tensor arguments are untyped
        dist.reduce_scatter_single(out, moved, group=ctx.group)  # pyright: ignore[reportUnknownMemberType]
        return out.movedim(0, dim).contiguous(), None, None, None


def _gather(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None, *, replicated: bool) -> torch.Tensor:
    gathered = _GatherSequence.apply(x, dim, group, replicated)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast(torch.Tensor, gathered)


def gather_partial(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Full sequence (global order) from every rank's zig-zag piece; backward: reduce-scatter (sum).

    Use it when each rank goes on with its own part of the computation (attention of its queries).
    """
    if dist.get_world_size(group) == 1:
        return x
    return _gather(x, dim, group, replicated=False)


def gather_replicated(x: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Full sequence (global order) from every rank's zig-zag piece; backward: keep this rank's slice.

    Use it when every rank computes the same function of the full tensor (the loss).
    """
    if dist.get_world_size(group) == 1:
        return x
    return _gather(x, dim, group, replicated=True)


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: list[int],
    *,
    cp: int = 1,
    cp_rank: int = 0,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Per-sample causal attention of this rank's queries.

    Args:
        q: ``[heads, s_local, d]``, this rank's queries (its zig-zag chunks when cp > 1).
        k, v: ``[kv_heads, s_global, d]``, every key and value of the row in global order.
        cu_seqlens: sample boundaries in global positions, ``0 … s_global``.
        cp, cp_rank: context-parallel size and this rank's index in the CP group.

    Returns:
        ``[heads, s_local, d]`` in the local order of ``q``.
    """
    length = k.shape[1]
    if q.shape[1] * cp != length:
        raise ValueError(f"{q.shape[1]} local queries x cp {cp} != {length} keys")
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads are not a multiple of {k.shape[0]} key/value heads")
    groups = q.shape[0] // k.shape[0]
    fused = q.is_cuda  # see _block_attention
    outs: list[torch.Tensor] = []
    offset = 0
    for g0, g1 in chunk_bounds(length, cp, cp_rank):
        for s, e in itertools.pairwise(cu_seqlens):
            qs, qe = max(s, g0), min(e, g1)
            if qe <= qs:
                continue
            outs.append(
                _block_attention(
                    q[:, offset + qs - g0 : offset + qe - g0],
                    k[:, s:qe],
                    v[:, s:qe],
                    past=qs - s,
                    groups=groups,
                    fused=fused,
                    scale=scale,
                    dropout=dropout,
                )
            )
        offset += g1 - g0
    return torch.cat(outs, dim=1)


def _block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    past: int,
    groups: int,
    fused: bool,
    scale: float | None,
    dropout: float,
) -> torch.Tensor:
    """Causal attention of one block of a sample's queries ``[heads, n, d]`` against the sample's keys
    up to the block's end ``[kv_heads, past + n, d]``; query i sees keys ``0 … past + i``.

    On CUDA the key/value heads are repeated and the lower-right causal structure is a ``CausalBias``
    on 4-D tensors: a boolean mask or ``enable_gqa`` would send SDPA to the math kernel, which
    materialises the whole score matrix. Elsewhere a boolean mask with ``enable_gqa`` (the CPU
    kernels take both).
    """
    if fused:
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        bias = causal_lower_right(q.shape[1], k.shape[1]) if past else None
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=bias, is_causal=bias is None, dropout_p=dropout, scale=scale
        )
        return out[0]
    mask = None  # a block that starts its sample is plain causal (square)
    if past:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(past)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=dropout, scale=scale, enable_gqa=True
    )
