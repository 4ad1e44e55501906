"""Packing reads a rollout engine's ``array.array`` token values (``TokenArray``) as it reads lists."""

from __future__ import annotations

import array

import numpy as np
import torch

from telescope_algos import TrainingSample, logprob_array, pack_samples


def test_samples_of_arrays_pack_as_samples_of_lists():
    def sample(kind: str) -> TrainingSample:
        ids, mask, lps = [7, 8, 9], [1, 0, 1], [-0.5, 0.0, -1.25]
        if kind == "array":
            return TrainingSample(
                prompt_ids=[1, 2], completion_ids=array.array("i", ids), advantage=0.5,
                completion_mask=array.array("b", mask), rollout_logprobs=array.array("d", lps),
            )  # fmt: skip
        return TrainingSample(
            prompt_ids=[1, 2], completion_ids=ids, advantage=0.5, completion_mask=mask, rollout_logprobs=lps
        )

    (got,), (want,) = pack_samples([sample("array")], seq_len=8), pack_samples([sample("list")], seq_len=8)
    assert got
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for name in ("input_ids", "loss_mask", "rollout_logprobs", "advantages"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert got[0].rollout_logprobs[0, :5].tolist() == [0.0, 0.0, -0.5, 0.0, -1.25]


def test_logprobs_are_float32_with_a_missing_one_as_zero():
    assert logprob_array([-0.5, None, -1.25]).tolist() == [-0.5, 0.0, -1.25]
    got = logprob_array(array.array("d", [-0.5, -0.1]))
    assert got.dtype == np.float32
    assert got.tolist() == [-0.5, np.float32(-0.1)]  # rounded to float32, as the trainer reads it
    assert logprob_array([]).shape == (0,)


def test_a_cut_or_short_completion_gets_zeros_where_it_has_no_logprob():
    short = TrainingSample(prompt_ids=[1], completion_ids=[7, 8, 9], advantage=1.0, rollout_logprobs=[-0.5])
    long = TrainingSample(
        prompt_ids=[1], completion_ids=[7], advantage=1.0, rollout_logprobs=array.array("d", [-0.5, -2.0])
    )
    (a,), (b,) = pack_samples([short], seq_len=4), pack_samples([long], seq_len=2)
    assert a[0].rollout_logprobs[0].tolist() == [0.0, -0.5, 0.0, 0.0]
    assert b[0].rollout_logprobs[0].tolist() == [0.0, -0.5]
