"""Samples packed into one row never attend to each other (whichever attention kernel runs).

The trainer forward (FSDP2, gradient checkpointing on, train mode) of a packed row must give every
sample the per-token logprobs it gets alone, within 1e-5 in fp32. A negative control shows that the
same comparison fails when the segments are hidden from the attention.
"""

from __future__ import annotations

import pytest
import torch

from telescope_algos import pack_samples
from telescope_trainer_fsdp._step import forward_logprobs


def _alone(trainer, sample, temperature):
    (mbs,) = pack_samples([sample], seq_len=256)
    lp, ent = forward_logprobs(
        trainer.model, mbs[0], device=trainer.device, temperature=temperature, chunk_size=7
    )
    n = len(sample.prompt_ids) + len(sample.completion_ids)
    return lp[0, 1:n], ent[0, 1:n]  # drop column 0 (no prediction)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "telescope_packed_sdpa"])
@pytest.mark.parametrize("tied", [False, True])
def test_packed_logprobs_equal_each_sample_alone(helpers, tiny_model_dir, tiny_tied_model_dir, attn, tied):
    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    samples = helpers.make_samples(5, seed=13)
    cfg = helpers.make_config(model_dir, temperature=0.8)
    with helpers.open_trainer(cfg, attn_implementation=attn) as trainer:
        assert trainer.model.training
        (mbs,) = pack_samples(samples, seq_len=256, pad_to_multiple_of=16)
        (mb,) = mbs
        assert mb.num_samples == 5
        lp, ent = forward_logprobs(trainer.model, mb, device=trainer.device, temperature=0.8, chunk_size=7)
        starts = (mb.position_ids[0] == 0).nonzero()[:, 0].tolist()
        # pack_samples orders by length (longest first); find each sample by its tokens
        for s in samples:
            ids = torch.tensor([*s.prompt_ids, *s.completion_ids])
            n = ids.numel()
            (start,) = [p for p in starts if torch.equal(mb.input_ids[0, p : p + n], ids)]
            alone_lp, alone_ent = _alone(trainer, s, 0.8)
            torch.testing.assert_close(lp[0, start + 1 : start + n], alone_lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent[0, start + 1 : start + n], alone_ent, atol=1e-5, rtol=0)

        # Negative control: positions that never restart hide the boundaries -> cross-sample attention.
        leaky = type(mb)(**{**vars(mb), "position_ids": torch.arange(len(mb))[None]})
        lp_leaky, _ = forward_logprobs(
            trainer.model, leaky, device=trainer.device, temperature=0.8, chunk_size=7
        )
        second = starts[1]
        n2 = starts[2] - second
        assert (lp_leaky[0, second + 1 : second + n2] - lp[0, second + 1 : second + n2]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("positions", "spans"),
    [
        ([0, 1, 2, 0, 1, 0, 1, 2, 3], [(0, 3), (3, 5), (5, 9)]),  # three samples
        ([0, 1, 2, 3], [(0, 4)]),  # one sample fills the row
        ([0, 0, 0], [(0, 1), (1, 2), (2, 3)]),  # one-token samples
        ([5, 6, 7, 0, 1], [(0, 3), (3, 5)]),  # a row that starts mid-sample (a shard of a longer row)
    ],
)
def test_sample_spans_are_where_positions_stop_counting_up(positions, spans):
    from telescope_trainer_fsdp._packed_attention import sample_spans

    assert sample_spans(torch.tensor(positions)) == spans


def test_packed_sdpa_refuses_a_mask_or_missing_positions():
    from telescope_trainer_fsdp._packed_attention import packed_sdpa_forward

    q = torch.zeros(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="needs position_ids"):
        packed_sdpa_forward(module, q, q, q, None)
    with pytest.raises(ValueError, match="takes no attention mask"):
        packed_sdpa_forward(module, q, q, q, torch.ones(1, 1, 4, 4), position_ids=torch.arange(4)[None])


def test_packed_sdpa_equals_sdpa_with_the_segment_mask_under_grouped_query_attention():
    """Hand-built reference: one row of two samples, 4 query heads over 2 key/value heads."""
    from telescope_trainer_fsdp._packed_attention import packed_sdpa_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 7, 8, generator=g) for h in (4, 2, 2))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    segment = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(7, 7, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), attn_mask=allowed
    )
    out, _ = packed_sdpa_forward(torch.nn.Module(), q, k, v, None, position_ids=positions)
    assert out.shape == (1, 7, 4, 8)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=0)
