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


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
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
