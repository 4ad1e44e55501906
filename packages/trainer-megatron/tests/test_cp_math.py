"""Context parallelism, the pure parts: the zig-zag split, the per-rank packed attention, the
label/alignment helpers and the RoPE slice; plus a two-rank check of the autograd all-gathers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_spawn import run_ranks

from telescope_trainer_megatron._context_parallel import (
    chunk_bounds,
    gather_order,
    packed_attention,
    split_length,
    zigzag_indices,
)
from telescope_trainer_megatron._cpu_shim import _cpu_pos_emb_on_this_cp_rank
from telescope_trainer_megatron._vocab_parallel import align_to_inputs, next_token_labels


def test_zigzag_split_by_hand():
    # L = 8, cp = 2: 4 chunks of 2 -> rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert chunk_bounds(8, 2, 0) == [(0, 2), (6, 8)]
    assert chunk_bounds(8, 2, 1) == [(2, 4), (4, 6)]
    assert zigzag_indices(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_indices(8, 2, 1).tolist() == [2, 3, 4, 5]
    # L = 12, cp = 3: 6 chunks of 2 -> rank r holds chunks r and 5 - r
    assert zigzag_indices(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert zigzag_indices(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert zigzag_indices(12, 3, 2).tolist() == [4, 5, 6, 7]
    assert gather_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert zigzag_indices(5, 1, 0).tolist() == [0, 1, 2, 3, 4]
    assert chunk_bounds(5, 1, 0) == [(0, 5)]


def test_split_length_pads_to_twice_cp():
    assert split_length(45, 2) == 48  # next multiple of 4
    assert split_length(48, 2) == 48
    assert split_length(49, 3) == 54  # next multiple of 6
    assert split_length(7, 1) == 7


def test_split_refuses_bad_lengths_and_ranks():
    with pytest.raises(ValueError, match="multiple of 2 x 2 = 4"):
        zigzag_indices(6, 2, 0)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        chunk_bounds(8, 2, 2)


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_rope_slice_is_megatrons_zigzag():
    # Megatron's get_pos_emb_on_this_cp_rank: view [2cp, L/2cp], index_select [r, 2cp-1-r]
    emb = torch.arange(8.0).view(8, 1, 1, 1)
    assert _cpu_pos_emb_on_this_cp_rank(emb, 0, _Group(2, 0)).flatten().tolist() == [0, 1, 6, 7]
    assert _cpu_pos_emb_on_this_cp_rank(emb, 0, _Group(2, 1)).flatten().tolist() == [2, 3, 4, 5]


def test_labels_and_alignment_by_hand():
    assert next_token_labels(torch.tensor([[5, 6, 7]])).tolist() == [[6, 7, 0]]
    assert align_to_inputs(torch.tensor([[1.0, 2.0, 3.0]])).tolist() == [[0.0, 1.0, 2.0]]


def _dense_reference(q, k, v, segment, scale):
    """Plain softmax attention with an explicit [L, L] same-sample-and-causal mask (independent)."""
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    pos = torch.arange(q.shape[1])
    allowed = (segment[:, None] == segment[None, :]) & (pos[None, :] <= pos[:, None])
    scores = (q @ k.transpose(1, 2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_packed_attention_per_rank_equals_dense_masked_attention(cp: int):
    torch.manual_seed(0)
    length, heads, kv_heads, dim = 16, 4, 2, 8
    q = torch.randn(heads, length, dim, dtype=torch.float64)
    k = torch.randn(kv_heads, length, dim, dtype=torch.float64)
    v = torch.randn(kv_heads, length, dim, dtype=torch.float64)
    # samples [0, 5) [5, 13) [13, 15) and a one-token ghost [15, 16): several straddle chunk edges
    cu = [0, 5, 13, 15, 16]
    segment = torch.tensor([0] * 5 + [1] * 8 + [2] * 2 + [3])
    ref = _dense_reference(q, k, v, segment, scale=0.3)
    for rank in range(cp):
        idx = zigzag_indices(length, cp, rank)
        got = packed_attention(q[:, idx], k, v, cu, cp=cp, cp_rank=rank, scale=0.3)
        torch.testing.assert_close(got, ref[:, idx], rtol=1e-12, atol=1e-12)


def test_packed_attention_checks_the_local_length():
    q, kv = torch.zeros(2, 3, 4), torch.zeros(1, 8, 4)
    with pytest.raises(ValueError, match="3 local queries x cp 2 != 8 keys"):
        packed_attention(q, kv, kv, [0, 8], cp=2, cp_rank=0)


@pytest.mark.slow
def test_gathers_put_pieces_in_order_and_route_gradients(tmp_path: Path):
    results = run_ranks({}, 2, tmp_path, timeout=300, worker=Path(__file__).with_name("cp_gather_worker.py"))
    for name, full, dim in (
        ("rows", torch.arange(24.0).view(8, 3), 0),
        ("cols", torch.arange(8.0).view(1, 8), 1),
    ):
        weight = torch.arange(1.0, full.numel() + 1).view_as(full)
        for rank, out in enumerate(results):
            idx = out["idx"]
            assert idx.tolist() == ([0, 1, 6, 7] if rank == 0 else [2, 3, 4, 5])
            assert torch.equal(out[f"{name}_replicated"], full)
            assert torch.equal(out[f"{name}_partial"], full)
            # replicated: every rank computed the same loss; a rank keeps d loss / d its own piece = w
            assert torch.equal(out[f"{name}_replicated_grad"], weight.index_select(dim, idx))
            # partial: the gradients of both ranks' losses (w and 10·w) are summed: 11·w
            assert torch.equal(out[f"{name}_partial_grad"], 11 * weight.index_select(dim, idx))
