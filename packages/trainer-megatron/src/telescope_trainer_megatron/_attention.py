"""Core attention for packed rows on the local (non-Transformer-Engine) layer spec, without a mask.

megatron-core's local ``DotProductAttention`` only accepts a dense ``[s × s]`` mask, refuses
``PackedSeqParams`` and asserts that context parallelism is off; working around it with one
segment-plus-causal mask per micro-batch would cost O(seq_len²) memory, and CP would need
Transformer Engine.
:class:`PackedDotProductAttention` takes the sample boundaries instead (``PackedSeqParams`` with
``qkv_format="sbhd"``, ``cu_seqlens_q`` in *global* row positions, ``max_seqlen_q`` the global row
length) and runs causal scaled-dot-product attention on each sample separately, so memory is
O(Σ len_i²) and no row-wide mask is built. RoPE was applied before with positions counted from the
row start; attention scores depend only on position differences, which are the same inside a
sample, so the result equals the per-sample computation.

Context parallelism (``context_parallel_size`` = cp > 1): this rank holds the zig-zag chunks of the
row (``_context_parallel``), RoPE already used their global positions (Megatron slices its rotary
table the same way). Keys and values are all-gathered over the CP group (backward: reduce-scatter),
and every local query attends to the keys of its own sample up to its own global position: for a
query block that starts inside a sample, a small lower-right causal mask of
``[block queries × sample keys so far]``. This all-gather-KV scheme is exact (same scores as cp = 1).
Without ``packed_seq_params`` (and cp = 1) it falls back to Megatron's implementation. With
Transformer Engine the backend uses TE's attention instead of this class.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist

from telescope_algos.backend import gather_partial, packed_attention
from telescope_trainer_megatron._requirements import require_megatron

require_megatron()

from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

__all__ = ["PackedDotProductAttention"]


class PackedDotProductAttention(DotProductAttention):
    """``DotProductAttention`` that isolates packed samples by their ``cu_seqlens`` (and does CP)."""

    hidden_size_per_partition: int  # set by Megatron's __init__ (from its untyped ``divide``)

    def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
        # Megatron's local attention asserts cp == 1; this class does CP itself (module docstring).
        cp = config.context_parallel_size
        config.context_parallel_size = 1
        try:
            super().__init__(config, *args, **kwargs)
        finally:
            config.context_parallel_size = cp
        self.cp = cp

    def forward(  # Megatron's positional signature
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            if self.cp > 1:
                raise ValueError("context parallelism needs packed_seq_params (the sample boundaries)")
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if query.shape[1] != 1:
            raise ValueError(f"packed attention expects one packed row per micro-batch, got {query.shape[1]}")
        cp_rank = 0
        if self.cp > 1:
            from megatron.core import parallel_state as ps

            group = cast(dist.ProcessGroup, ps.get_context_parallel_group())
            cp_rank = cast(int, ps.get_context_parallel_rank())
            key, value = gather_partial(key, 0, group), gather_partial(value, 0, group)
        bounds = packed_seq_params.cu_seqlens_q  # torch's stub types tolist() as a bare list
        cu_seqlens = cast(list[int], bounds.tolist())  # pyright: ignore[reportUnknownMemberType]
        # [s, 1, heads, d] -> [heads, s, d]
        q, k, v = (x[:, 0].transpose(0, 1) for x in (query, key, value))
        context = packed_attention(
            q,
            k,
            v,
            cu_seqlens,
            cp=self.cp,
            cp_rank=cp_rank,
            scale=self.softmax_scale,
            dropout=self.config.attention_dropout if self.training else 0.0,
        )
        return context.transpose(0, 1).reshape(query.shape[0], 1, self.hidden_size_per_partition)
