"""Core attention for packed rows on the local (non-Transformer-Engine) layer spec, without a mask.

megatron-core's local ``DotProductAttention`` only accepts a dense ``[s × s]`` mask, and refuses
``PackedSeqParams``. Upstream therefore built one segment-plus-causal mask per micro-batch
(O(seq_len²) memory). :class:`PackedDotProductAttention` takes the sample boundaries instead
(``PackedSeqParams`` with ``qkv_format="sbhd"`` and ``cu_seqlens_q``) and runs causal
scaled-dot-product attention on each sample separately, so memory is O(Σ len_i²) and no mask is
built. RoPE was applied before with positions counted from the row start; attention scores depend
only on position differences, which are the same inside a sample, so the result equals the
per-sample computation. Without ``packed_seq_params`` it falls back to Megatron's implementation.
With Transformer Engine the backend passes ``qkv_format="thd"`` params to TE's fused attention.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention

__all__ = ["PackedDotProductAttention"]


class PackedDotProductAttention(DotProductAttention):
    """``DotProductAttention`` that isolates packed samples by their ``cu_seqlens``."""

    def forward(  # noqa: PLR0917 (Megatron's positional signature)
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if query.shape[1] != 1:
            raise ValueError(f"packed attention expects one packed row per micro-batch, got {query.shape[1]}")
        # [s, 1, heads, d] -> [heads, s, d]
        q, k, v = (x[:, 0].transpose(0, 1) for x in (query, key, value))
        dropout = self.config.attention_dropout if self.training else 0.0
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        outs = []
        for start, end in itertools.pairwise(bounds):
            if end > start:
                outs.append(
                    F.scaled_dot_product_attention(
                        q[:, start:end],
                        k[:, start:end],
                        v[:, start:end],
                        is_causal=True,
                        dropout_p=dropout,
                        scale=self.softmax_scale,
                        enable_gqa=True,
                    )
                )
        context = torch.cat(outs, dim=1)  # [heads, s, d]
        return context.transpose(0, 1).reshape(query.shape[0], 1, self.hidden_size_per_partition)
