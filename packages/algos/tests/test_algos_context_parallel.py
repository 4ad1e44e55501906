"""Context parallelism, the pure parts: the zig-zag split, the per-rank packed attention and the
label/alignment helpers; plus a two-rank gloo check of the autograd all-gathers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope_algos import (
    align_to_inputs,
    label_logprobs_and_entropy,
    next_token_labels,
    token_logprobs_and_entropy,
)
from telescope_algos._context_parallel import _block_attention
from telescope_algos.backend import (
    chunk_bounds,
    cu_seqlens,
    gather_order,
    packed_attention,
    split_length,
    zigzag_indices,
)
from telescope_algos.testing import run_ranks


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


def test_cu_seqlens_by_hand():
    # samples of 3, 2 and 1 tokens, then a row that does not start at position 0
    assert cu_seqlens(torch.tensor([[0, 1, 2, 0, 1, 0]])) == [0, 3, 5, 6]
    assert cu_seqlens(torch.tensor([[4, 5, 0, 1]])) == [0, 2, 4]


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


def test_labels_and_alignment_by_hand():
    assert next_token_labels(torch.tensor([[5, 6, 7]])).tolist() == [[6, 7, 0]]
    assert align_to_inputs(torch.tensor([[1.0, 2.0, 3.0]])).tolist() == [[0.0, 1.0, 2.0]]


def test_label_logprobs_on_a_zigzag_piece_equal_the_full_row_after_alignment():
    # What a CP rank does: logits of its positions, labels of the same positions, gather, align.
    torch.manual_seed(3)
    ids = torch.randint(0, 11, (1, 8))
    logits = torch.randn(1, 8, 11, dtype=torch.float64)
    full_lp, full_ent = token_logprobs_and_entropy(logits, ids, temperature=0.7)
    labels = next_token_labels(ids)
    pieces = []
    for rank in range(2):
        idx = zigzag_indices(8, 2, rank)
        pieces.append((idx, label_logprobs_and_entropy(logits[:, idx], labels[:, idx], temperature=0.7)))
    lp = torch.zeros(1, 8, dtype=torch.float64)
    ent = torch.zeros(1, 8, dtype=torch.float64)
    for idx, (p_lp, p_ent) in pieces:
        lp[:, idx], ent[:, idx] = p_lp, p_ent
    torch.testing.assert_close(align_to_inputs(lp), full_lp, rtol=0, atol=0)
    torch.testing.assert_close(align_to_inputs(ent), full_ent, rtol=0, atol=0)
    # by hand, position 0 of rank 0: log softmax(logits[0, 0] / 0.7)[ids[0, 1]]
    z = logits[0, 0] / 0.7
    assert lp[0, 0].item() == pytest.approx((z - z.logsumexp(0))[ids[0, 1]].item(), abs=1e-12)


def test_label_logprobs_refuse_mismatched_labels():
    with pytest.raises(ValueError, match="labels"):
        label_logprobs_and_entropy(torch.zeros(1, 4, 3), torch.zeros(1, 5, dtype=torch.long))


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


@pytest.mark.parametrize("past", [0, 3])
def test_the_cuda_form_of_a_block_equals_the_masked_form(past: int):
    # CUDA takes repeated key/value heads and a lower-right CausalBias; run that form here too
    torch.manual_seed(1)
    q = torch.randn(4, 5, 8, dtype=torch.float64)
    k = torch.randn(2, past + 5, 8, dtype=torch.float64)
    v = torch.randn(2, past + 5, 8, dtype=torch.float64)
    options = {"past": past, "groups": 2, "scale": 0.3, "dropout": 0.0}
    fused = _block_attention(q, k, v, fused=True, **options)
    masked = _block_attention(q, k, v, fused=False, **options)
    torch.testing.assert_close(fused, masked, rtol=1e-12, atol=1e-12)
    segment = torch.zeros(past + 5, dtype=torch.long)
    padded = torch.cat([torch.zeros(4, past, 8, dtype=torch.float64), q], 1)  # queries of the earlier keys
    ref = _dense_reference(padded, k, v, segment, 0.3)
    torch.testing.assert_close(masked, ref[:, past:], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_packed_attention_runs_on_fused_cuda_kernels_with_grouped_heads():
    # the math kernel would materialise [heads, L, L] scores: allowing only flash and memory-efficient
    # attention makes SDPA raise if a block needed it
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    length, heads, kv_heads, dim = 256, 8, 2, 64
    q = torch.randn(heads, length, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(kv_heads, length, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(kv_heads, length, dim, device="cuda", dtype=torch.bfloat16)
    cu = [0, 100, 230, 256]
    segment = torch.tensor([0] * 100 + [1] * 130 + [2] * 26)
    ref = _dense_reference(q.double().cpu(), k.double().cpu(), v.double().cpu(), segment, scale=dim**-0.5)
    for rank in range(2):
        idx = zigzag_indices(length, 2, rank)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            got = packed_attention(q[:, idx.cuda()], k, v, cu, cp=2, cp_rank=rank)
        torch.testing.assert_close(got.double().cpu(), ref[:, idx], rtol=2e-2, atol=2e-2)


def test_packed_attention_checks_the_local_length():
    q, kv = torch.zeros(2, 3, 4), torch.zeros(1, 8, 4)
    with pytest.raises(ValueError, match="3 local queries x cp 2 != 8 keys"):
        packed_attention(q, kv, kv, [0, 8], cp=2, cp_rank=0)


def _run_two_ranks(tmp: Path) -> list[dict]:
    """``cp_gather_worker.py`` on two gloo ranks; rank 0 saves both ranks' results."""
    worker = Path(__file__).with_name("cp_gather_worker.py")
    run_ranks(worker, [str(tmp / "out.pt")], world=2, log_dir=tmp, timeout_s=300)
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.slow
def test_gathers_put_pieces_in_order_and_route_gradients(tmp_path: Path):
    results = _run_two_ranks(tmp_path)
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
