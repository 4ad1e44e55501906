"""The backend-neutral pieces of a train step: loss options, minibatch groups, row multiples, RNG."""

from __future__ import annotations

import dataclasses
import inspect
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import telescope_algos as ta
from telescope_algos import LossOptions, compute_loss
from telescope_algos.backend import (
    loss_options,
    minibatch_groups,
    needs_old_logprobs,
    pad_multiple,
    rng_state,
    row_multiple,
    set_rng_state,
)

# The loss fields both backends read (the list the Megatron backend once kept by hand).
LOSS_FIELDS = [
    "algorithm", "clip_high", "clip_low", "clip_ratio_c", "distill_coef", "distill_reward_weight",
    "dr_grpo_loss_agg_mode", "entropy_coef", "kl_estimator", "kl_penalty_tau", "ref_kl_coef",
    "ref_kl_estimator", "sapo_tau_neg", "sapo_tau_pos", "seq_is_mask_high",
    "seq_is_mask_low", "seq_is_masking", "tis_cap", "tis_floor", "tis_logprob_clamp", "tis_mode",
    "use_ppo_clip", "use_tis",
]  # fmt: skip


def test_loss_options_read_every_loss_field_of_the_config_and_nothing_else():
    config = SimpleNamespace(**{n: f"value of {n}" for n in LOSS_FIELDS}, learning_rate=1e-6, seq_len=8)
    options = loss_options(config)
    assert isinstance(options, LossOptions)
    assert sorted(f.name for f in dataclasses.fields(options)) == LOSS_FIELDS
    assert options.tis_cap == "value of tis_cap"
    # compute_loss takes them as one argument, apart from the data (LossInputs): no name is both
    params = inspect.signature(compute_loss).parameters
    assert list(params) == ["inputs", "options"]
    data = {f.name for f in dataclasses.fields(ta.LossInputs)}
    assert not set(LOSS_FIELDS) & data


def test_a_config_without_a_loss_field_is_an_error():
    config = SimpleNamespace(**{n: 0 for n in LOSS_FIELDS if n != "tis_cap"})
    with pytest.raises(ValueError, match=r"lacks loss fields \['tis_cap'\]"):
        loss_options(config)


@pytest.mark.parametrize(
    ("algorithm", "ppo", "ref", "expected"),
    [
        ("grpo", False, "batch", False),  # no ratio: no pre-update pass
        ("grpo", True, "batch", True),
        ("grpo", True, "rollout", False),  # the ratio is against the rollout's logprobs
        ("gspo", False, "batch", True),
        ("cispo", False, "rollout", False),
    ],
)
def test_needs_old_logprobs(algorithm, ppo, ref, expected):
    config: Any = SimpleNamespace(algorithm=algorithm, use_ppo_clip=ppo, ppo_clip_ref_logprobs=ref)
    assert needs_old_logprobs(config) is expected


def test_minibatch_groups_deal_round_robin():
    assert minibatch_groups(5, 2) == [[0, 2, 4], [1, 3]]
    assert minibatch_groups(2, 4) == [[0], [1]]  # never an empty group
    assert minibatch_groups(3, 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match=">= 1"):
        minibatch_groups(3, 0)


@pytest.mark.parametrize(
    ("cp", "tp", "expected"),
    [(1, 1, 1), (1, 2, 2), (2, 1, 4), (4, 1, 8), (2, 2, 4), (3, 2, 6), (2, 3, 12)],  # cp·lcm(2, tp)
)
def test_row_multiple(cp, tp, expected):
    assert row_multiple(context_parallel=cp, tensor_parallel=tp) == expected


def test_pad_multiple_is_the_least_common_multiple():
    assert pad_multiple(1, 1) == 1
    assert pad_multiple(6, 4) == 12
    assert pad_multiple(8, 4) == 8


def test_rng_state_round_trip():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    saved = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    set_rng_state(saved)
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[:2] == expected[:2]
    assert torch.equal(got[2], expected[2])


def test_step_counts_total_tokens_and_samples_per_group():
    import torch.distributed as dist
    from torch._C._distributed_c10d import HashStore

    from telescope_algos import TrainingSample, pack_samples
    from telescope_algos.backend import step_counts

    samples = [
        TrainingSample(
            prompt_ids=[1, 2], completion_ids=[3, 4, 5], advantage=1.0, rollout_logprobs=[-1.0] * 3
        ),
        TrainingSample(prompt_ids=[1], completion_ids=[6, 7], advantage=-1.0, rollout_logprobs=[-1.0] * 2),
        TrainingSample(prompt_ids=[1, 2, 3], completion_ids=[8], advantage=0.5, rollout_logprobs=[-1.0]),
    ]
    [mbs] = pack_samples(samples, seq_len=6, num_ranks=1)  # 5 + 3 + 4 tokens: one row each
    assert len(mbs) == 3
    store = HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        counts = step_counts(mbs, minibatch_groups(len(mbs), 2))
    finally:
        dist.destroy_process_group()
    # groups [0, 2] and [1]; loss tokens are completion tokens: which rows hold which sample is
    # the packer's choice, so check the totals against each row's own counts
    by_row = [(mb.num_tokens, mb.num_samples) for mb in mbs]
    assert counts.tokens == [by_row[0][0] + by_row[2][0], by_row[1][0]]
    assert counts.samples == [by_row[0][1] + by_row[2][1], by_row[1][1]]
    assert sum(counts.tokens) == 3 + 2 + 1
    assert sum(counts.samples) == 3


def test_lr_schedule_reads_the_config_and_checks_it_at_once():
    config: Any = SimpleNamespace(lr_scheduler="linear", warmup_steps=2, number_of_steps=6, min_lr_ratio=0.1)
    schedule = ta.backend.lr_schedule(config)
    for step in range(8):
        expected = ta.lr_multiplier(step, schedule="linear", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
        assert schedule(step) == expected
    bad: Any = SimpleNamespace(lr_scheduler="step", warmup_steps=0, number_of_steps=6, min_lr_ratio=0.0)
    with pytest.raises(ValueError, match="unknown lr_scheduler"):
        ta.backend.lr_schedule(bad)


def test_a_step_without_micro_batches_is_an_error():
    with pytest.raises(ValueError, match="no micro-batches"):
        ta.backend.check_micro_batches([])


def test_micro_batch_loss_is_compute_loss_with_the_group_totals():
    samples = [
        ta.TrainingSample([1, 2], [3, 4, 5], advantage=1.0, rollout_logprobs=[-1.0, -0.5, -2.0]),
        ta.TrainingSample([1], [6, 7], advantage=-0.5, rollout_logprobs=[-0.3, -0.7]),
    ]
    [[mb]] = ta.pack_samples(samples, seq_len=16)
    logprobs = -torch.rand(1, len(mb), generator=torch.Generator().manual_seed(0))
    entropy = torch.rand(1, len(mb), requires_grad=True)
    counts = ta.backend.StepCounts(tokens=[40, 7], samples=[9, 2])
    options = ta.LossOptions(use_tis=True, kl_penalty_tau=0.1)
    loss, metrics = ta.backend.micro_batch_loss(
        mb, logprobs, entropy, old_logprobs=None, counts=counts, group=1, max_len=12, options=options
    )
    expected, expected_metrics = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            rollout_logprobs=mb.rollout_logprobs,
            entropy=entropy,
            position_ids=mb.position_ids,
            num_tokens=7,
            num_samples=2,
            max_len=12,
        ),
        options,
    )
    assert_close(loss, expected)
    assert metrics.keys() == expected_metrics.keys()
    assert not loss.requires_grad  # no entropy bonus: the entropy's gradient is dropped


def test_step_log_records_norms_skips_and_timings():
    log = ta.backend.StepLog()
    with log.timed("optimizer"):
        log.update(2.0, applied=True)
    with log.timed("optimizer"):
        log.update(float("inf"), applied=False)
    log.update(4.0, applied=True)
    out = log.metrics(learning_rate=0.5, skipped_total=3, device=torch.device("cpu"))
    assert out == {
        "grad_norm": float("inf"),
        "learning_rate": 0.5,
        "skipped_steps": 1.0,
        "skipped_steps_total": 3.0,
    }
    timings = log.timing_metrics()
    assert sorted(timings) == ["timing/optimizer", "timing/step"]
    assert 0.0 <= timings["timing/optimizer"] <= timings["timing/step"]
    assert (
        ta.backend.StepLog().metrics(learning_rate=1.0, skipped_total=0, device=torch.device("cpu"))[
            "grad_norm"
        ]
        == 0.0
    )
