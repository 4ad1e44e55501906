"""Packing reads a rollout engine's ``array.array`` token values (``TokenArray``) as it reads lists."""

from __future__ import annotations

import array

import torch

from telescope_algos import TrainingSample, pack_samples


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
