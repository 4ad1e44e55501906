"""Sample boundaries inside padded or packed rows, and per-sample reductions over them.

A batch reaches the loss in one of two layouts:

* **padded**: ``[batch, seq]``, one sample per row, padding on the right with loss mask 0;
* **packed**: ``[rows, seq]``, several samples per row. Boundaries come either from
  ``position_ids`` (a new sample starts wherever a position does not continue the previous one: the
  layout :func:`telescope_algos.pack_samples` writes, where positions restart at 0 per sample, or
  at the length of a shared prompt for a branch, docs/algorithms.md#shared-prompts) or from explicit
  per-token ``segment_ids`` (a new sample starts wherever the id changes along the row).

Everything here turns that into one *global* segment index per token (0 … S-1, numbered row by
row, left to right), so per-sample reductions are a single ``index_add_`` with no Python loop per
token or per sample. The padding at the end of a packed row restarts at position 0 and so forms
its own "ghost" segment; it has no loss tokens and drops out of every masked reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segments:
    """Sample boundaries of a ``[rows, seq]`` batch.

    Attributes:
        ids: ``[rows, seq]`` long, the global segment index of every token (0 … ``count``-1).
        starts: ``[rows, seq]`` bool, True at the first token of every segment.
        count: number of segments S (including ghost padding segments).
    """

    ids: torch.Tensor
    starts: torch.Tensor
    count: int


def _from_starts(starts: torch.Tensor) -> Segments:
    starts = starts.clone()
    starts[:, 0] = True  # a row always opens a segment, whatever its first id says
    ids = starts.reshape(-1).long().cumsum(0).sub_(1).view_as(starts)
    return Segments(ids=ids, starts=starts, count=int(starts.sum().item()))


def segment_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Global segment index per token from packed ``position_ids`` ``[rows, seq]``.

    Example: one row ``[0, 1, 2, 0, 1, 0]`` gives ``[0, 0, 0, 1, 1, 2]``; so does ``[0, 1, 2, 1, 2, 0]``
    (a branch that shares its first token with the sample before it); a second row continues the
    numbering at 3.
    """
    return find_segments(position_ids.shape, position_ids=position_ids).ids


def find_segments(
    shape: torch.Size | tuple[int, ...],
    *,
    position_ids: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> Segments:
    """Resolve the sample layout of a ``[rows, seq]`` batch (see the module docstring).

    With neither ``position_ids`` nor ``segment_ids`` every row is one sample (padded layout).
    """
    if position_ids is not None and segment_ids is not None:
        raise ValueError("pass position_ids or segment_ids, not both")
    if len(shape) != 2:
        raise ValueError(f"expected a [rows, seq] batch, got shape {tuple(shape)}")
    given = position_ids if position_ids is not None else segment_ids
    if given is None:
        rows, seq = shape
        starts = torch.zeros(rows, seq, dtype=torch.bool, device=device)
        starts[:, 0] = True
        return _from_starts(starts)
    if tuple(given.shape) != tuple(shape):
        name = "position_ids" if position_ids is not None else "segment_ids"
        raise ValueError(f"{name} has shape {tuple(given.shape)}, expected {tuple(shape)}")
    starts = torch.ones_like(given, dtype=torch.bool)
    if position_ids is not None:
        starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    else:
        starts[:, 1:] = given[:, 1:] != given[:, :-1]
    return _from_starts(starts)


def segment_sum(values: torch.Tensor, segments: Segments) -> torch.Tensor:
    """Sum of ``values`` ``[rows, seq]`` per segment, shape ``[S]`` (differentiable)."""
    out = values.new_zeros(segments.count)
    return out.index_add(0, segments.ids.reshape(-1), values.reshape(-1))


def segment_mean(
    values: torch.Tensor, mask: torch.Tensor, segments: Segments
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean of ``values`` per segment, broadcast back to every token.

    Args:
        values: ``[rows, seq]`` float; entries where ``mask`` is False are ignored (even NaN).
        mask: ``[rows, seq]`` bool.
        segments: from :func:`find_segments`.

    Returns:
        ``(mean, count)``, both ``[rows, seq]``: the segment's masked mean (0 for a segment without
        masked tokens) and its masked-token count, as floats, at every token of the segment.
    """
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    sums = segment_sum(torch.where(mask, values, zero), segments)
    counts = segment_sum(mask.to(values.dtype), segments)
    means = sums / counts.clamp_min(1)
    return means[segments.ids], counts[segments.ids]
