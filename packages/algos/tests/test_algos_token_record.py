"""The per-token record of a train step: where each sample's tokens are in the packed rows
(``MicroBatch.spans``, ``sample_tokens``), what the loss did with each token (``loss_tokens``, worked
by hand) and a trainer's trace of a step (``backend.TokenTrace``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from telescope_algos import (
    LossInputs,
    LossOptions,
    MicroBatch,
    TrainingSample,
    loss_tokens,
    pack_samples,
    sample_tokens,
)
from telescope_algos.backend import TokenTrace, frozen_models, with_frozen_logprobs


def _ids(mbs):
    return [mb.input_ids[0] for mb in mbs]


def test_every_samples_tokens_are_read_back_from_the_rows_it_was_packed_into():
    samples = [
        TrainingSample([1, 2], [3, 4, 5], 1.0),
        TrainingSample([6], [7, 8], -1.0),
        TrainingSample([9, 10, 11], [12], 0.5),
    ]
    (mbs,) = pack_samples(samples, seq_len=6, pad_to_multiple_of=4)
    assert sum(mb.num_samples for mb in mbs) == 3
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    back = sample_tokens(mbs, _ids(mbs), lengths)
    for sample, values in zip(samples, back, strict=True):
        assert values.tolist() == [*sample.prompt_ids, *sample.completion_ids]
    # each span: (sample, column, position, length); a whole sample starts at position 0
    assert sorted(span[0] for mb in mbs for span in mb.spans) == [0, 1, 2]
    assert all(span[2] == 0 for mb in mbs for span in mb.spans)


def test_a_branch_leaves_its_shared_prompt_to_its_root():
    samples = [TrainingSample([1, 2, 3], [4, 5], 1.0), TrainingSample([1, 2, 3], [6, 7], -1.0)]
    (mbs,) = pack_samples(samples, seq_len=16, share_prompts=True)
    (mb,) = mbs
    assert mb.spans == ((0, 0, 0, 5), (1, 5, 2, 3))  # the branch keeps the last shared token
    root, branch = sample_tokens(mbs, _ids(mbs), [5, 5])
    assert root.tolist() == [1, 2, 3, 4, 5]
    assert np.isnan(branch[:2]).all()
    assert branch[2:].tolist() == [3, 6, 7]


def test_dummy_micro_batches_hold_no_sample_and_rows_must_match_their_micro_batch():
    shards = pack_samples([TrainingSample([1], [2], 1.0)], seq_len=4, num_ranks=2)
    assert [mb.spans for mb in shards[1]] == [()]  # the dummy copy of rank 0's row
    with pytest.raises(ValueError, match="a row of 3 values for a micro-batch of 2 columns"):
        sample_tokens(shards[0], [np.zeros(3)], [2])


def test_loss_tokens_by_hand():
    # one row of four tokens; token 0 starts the sample (never a loss token), token 3 is a prompt pad
    lp = torch.tensor([[0.0, math.log(0.5), math.log(0.2), math.log(0.9)]])
    roll = torch.tensor([[0.0, math.log(0.25), math.log(0.4), math.log(0.9)]])
    inputs = LossInputs(
        lp,
        advantages=torch.tensor([[1.0, 1.0, -1.0, 1.0]]),
        loss_mask=torch.tensor([[0, 1, 1, 0]]),
        rollout_logprobs=roll,
        old_logprobs=roll,  # the ratio's denominator; TIS corrects against the sampler's
        position_ids=torch.tensor([[0, 1, 2, 3]]),
    )
    options = LossOptions(use_ppo_clip=True, clip_low=0.2, clip_high=0.2, use_tis=True, tis_cap=1.5)
    out = loss_tokens(inputs, options)
    assert math.isnan(out["trainer_logprob"][0, 0])  # the sample's first token: nothing predicts it
    assert out["trainer_logprob"][0, 1:].tolist() == pytest.approx(lp[0, 1:].tolist())
    assert out["loss_mask"].tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert out["advantage"].tolist() == [[1.0, 1.0, -1.0, 1.0]]
    # TIS: min(π/π_roll, 1.5): 0.5/0.25 = 2 → 1.5, 0.2/0.4 = 0.5, 0.9/0.9 = 1
    assert out["is_weight"][0, 1:].tolist() == pytest.approx([1.5, 0.5, 1.0])
    # the ratio against π_old: 2 > 1.2 with A > 0 (clipped high); 0.5 < 0.8 with A < 0
    # (clipped low); 1 inside
    assert out["clipped"][0, 1:].tolist() == [1.0, -1.0, 0.0]
    assert all(t.dtype == torch.float32 and not t.requires_grad for t in out.values())


def test_opd_tokens_carry_the_teacher_term_in_their_advantage():
    lp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    inputs = LossInputs(
        lp,
        advantages=torch.tensor([[0.5, 0.5, 0.5]]),
        loss_mask=torch.tensor([[0, 1, 1]]),
        rollout_logprobs=torch.tensor([[0.0, -1.0, -2.0]]),
        teacher_logprobs=torch.tensor([[0.0, -0.5, -3.0]]),
        position_ids=torch.tensor([[0, 1, 2]]),
    )
    out = loss_tokens(inputs, LossOptions(algorithm="opd", distill_coef=2.0, distill_reward_weight=1.0))
    # 1·A + 2·(ℓ^T − ℓ^roll): 0.5 + 2·0.5 = 1.5, 0.5 + 2·(−1) = −1.5
    assert out["advantage"][0, 1:].tolist() == pytest.approx([1.5, -1.5])
    assert out["is_weight"].tolist() == [[1.0, 1.0, 1.0]]  # no TIS
    assert out["clipped"].tolist() == [[0.0, 0.0, 0.0]]


def test_a_trace_keeps_each_micro_batch_at_the_length_it_was_given():
    trace = TokenTrace([3, 2])
    trace.add(1, {"trainer_logprob": torch.tensor([[-1.0, -2.0, 0.0, 0.0]])})  # padded to 4 by the trainer
    rows = trace.rows()
    assert rows[0] is None
    assert rows[1] is not None
    assert rows[1]["trainer_logprob"].tolist() == [-1.0, -2.0]
    assert rows[1]["trainer_logprob"].dtype == np.float32


def test_a_trace_adds_a_frozen_models_logprobs_to_the_rows_of_its_loss():
    trace = TokenTrace([3, 2])
    trace.add_frozen(0, "teacher", torch.tensor([[0.0, -1.5, -2.5, 0.0]]))  # computed, never trained
    trace.add_frozen(1, "ref", torch.tensor([[0.0, -0.5]]))
    trace.add(1, {"trainer_logprob": torch.tensor([[0.0, -2.0]])})
    rows = trace.rows()
    assert rows[0] is None  # no loss row: nothing to record
    assert rows[1] is not None
    assert rows[1]["ref_logprob"].tolist() == [0.0, -0.5]
    assert set(rows[1]) == {"trainer_logprob", "ref_logprob"}


def test_frozen_models_are_named_and_fill_their_field():
    assert frozen_models(None) == {}
    assert frozen_models({"ref": "/r", "teacher": "/t"}) == {"ref": "/r", "teacher": "/t"}
    with pytest.raises(ValueError, match=r"unknown frozen models \['critic'\]; a trainer holds teacher, ref"):
        frozen_models({"critic": "/c"})
    mb = MicroBatch(
        input_ids=torch.tensor([[5, 6, 7]]),
        position_ids=torch.tensor([[0, 1, 2]]),
        loss_mask=torch.tensor([[0, 1, 1]]),
        advantages=torch.tensor([[0.0, 1.0, 1.0]]),
        rollout_logprobs=torch.tensor([[0.0, -1.5, -1.5]]),
        num_samples=1,
        num_tokens=2,
    )
    lp = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    out = with_frozen_logprobs(mb, "teacher", lp)
    assert out.teacher_logprobs is not None
    assert out.ref_logprobs is None
    assert out.teacher_logprobs.dtype == torch.float32
    assert not out.teacher_logprobs.requires_grad
    assert out.teacher_logprobs.tolist() == [[0.0, -1.0, -2.0]]
    assert mb.teacher_logprobs is None  # a copy


def test_a_token_outside_the_loss_is_never_clipped_or_weighed():
    # token 1 is in the loss, token 2 (an environment token: its sampler logprob is 0) is not; both
    # have a ratio of 2 against π_old with A > 0, which clips at the upper bound
    lp = torch.tensor([[0.0, math.log(0.5), math.log(0.5)]])
    old = torch.tensor([[0.0, math.log(0.25), math.log(0.25)]])
    inputs = LossInputs(
        lp,
        advantages=torch.tensor([[1.0, 1.0, 1.0]]),
        loss_mask=torch.tensor([[0, 1, 0]]),
        rollout_logprobs=torch.tensor([[0.0, math.log(0.25), 0.0]]),
        old_logprobs=old,
        position_ids=torch.tensor([[0, 1, 2]]),
    )
    out = loss_tokens(inputs, LossOptions(use_ppo_clip=True, clip_low=0.2, clip_high=0.2, use_tis=True))
    assert out["clipped"][0, 1:].tolist() == [1.0, 0.0]
    assert out["is_weight"][0, 1:].tolist() == pytest.approx([2.0, 1.0])  # tis_cap 2
    assert out["loss_mask"][0].tolist() == [0.0, 1.0, 0.0]
