"""Packed rows on CPU: SDPA's fused causal kernel once per sample, no mask.

A packed row holds several samples, each with ``position_ids`` restarting at 0. transformers' SDPA
path keeps them apart with a dense ``[T, T]`` segment mask, and an explicit mask sends CPU SDPA to
its slow path (on 2 CPU cores the mask's softmax and copies cost about 7% of a SmolLM2-135M step of
four 512-token rows, and more as rows grow: the mask is ``T²`` per row and layer).
``telescope_packed_sdpa`` instead finds each sample's span from the positions (a new sample starts
wherever a position does not continue the previous one, the rule transformers and flash-attn's
varlen kernel use) and runs ``is_causal`` SDPA on each span. Exact: a token sees its own sample's
earlier tokens and nothing else, as with the mask. The trainer uses it on CPU by default; on GPU
flash-attn's varlen kernel (or SDPA with the mask) is used instead.

It also honours *branches* (docs/algorithms.md#shared-prompts): a span whose first position ``q`` is
not 0 shares the first ``q`` tokens of the row's last span that starts at 0 (its root) and sees them
as its own, so a prompt shared by a group's samples is computed once. No other attention here does
this, so only this one lets the trainer pack shared prompts (``shares_prompts``).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

__all__ = ["PACKED_SDPA", "packed_sdpa_forward", "register_packed_sdpa", "row_attention", "sample_spans"]

PACKED_SDPA = "telescope_packed_sdpa"


def sample_spans(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each sample in one row of ``position_ids`` (shape ``[T]``)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[1:] = position_ids[1:] != position_ids[:-1] + 1
    # torch annotates tolist() as a bare list (here and below)
    bounds: list[int] = cast(Any, torch.nonzero(starts).flatten()).tolist()
    return list(zip(bounds, [*bounds[1:], position_ids.numel()], strict=True))


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query [B, H, T, D]``, ``key``/``value [B, H_kv, T, D]``;
    returns ``[B, T, H, D]``. Needs ``position_ids`` (the decoder layers pass them through)."""
    positions = kwargs.get("position_ids")
    if not isinstance(positions, torch.Tensor):
        raise ValueError(f"{PACKED_SDPA} needs position_ids: pass them to the model's forward")
    if attention_mask is not None:
        raise ValueError(f"{PACKED_SDPA} takes no attention mask: positions say where samples begin")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    p = dropout if module.training else 0.0
    rows = [
        row_attention(
            query[b : b + 1], key[b : b + 1], value[b : b + 1], positions[b], dropout=p, scale=scaling
        )
        for b in range(query.shape[0])
    ]
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


def row_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    *,
    dropout: float,
    scale: float | None,
) -> torch.Tensor:
    """Attention of one packed row ``[1, H, T, D]`` (``k``, ``v`` with as many heads as ``q``), span by
    span: causal within a span, and a branch also sees its root's first ``q`` tokens (module docstring)."""
    starts_at: list[int] = cast(Any, positions).tolist()
    out: list[torch.Tensor] = []
    root: int | None = None
    for s, e in sample_spans(positions):
        shared = starts_at[s]
        if shared == 0:
            root = s
        if shared == 0 or root is None:
            out.append(
                F.scaled_dot_product_attention(
                    q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], dropout_p=dropout, is_causal=True, scale=scale
                )
            )
            continue
        keys = torch.cat([k[:, :, root : root + shared], k[:, :, s:e]], dim=2)
        values = torch.cat([v[:, :, root : root + shared], v[:, :, s:e]], dim=2)
        # query i sits at position shared + i: it sees the shared prefix and its own first i + 1 tokens
        mask = torch.ones(e - s, shared + e - s, dtype=torch.bool, device=q.device).tril(diagonal=shared)
        out.append(
            F.scaled_dot_product_attention(
                q[:, :, s:e], keys, values, attn_mask=mask, dropout_p=dropout, scale=scale
            )
        )
    return torch.cat(out, dim=2)


def register_packed_sdpa() -> None:
    """Register ``telescope_packed_sdpa`` with transformers (idempotent). Its name has no mask builder,
    so transformers builds no mask for it."""
    from transformers import AttentionInterface

    # register's value is annotated as a bare Callable: the interface is reached through Any
    cast(Any, AttentionInterface).register(PACKED_SDPA, packed_sdpa_forward)
