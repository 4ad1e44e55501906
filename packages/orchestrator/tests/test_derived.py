"""Derived step metrics, against numbers worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from telescope_orchestrator.record import derived as _derived
from telescope_orchestrator.record.derived import cv, derived_metrics, gini, max_median_ratio, stats
from telescope_rollout.engine import DroppedGroup, RolloutBatch, ScoredGroup, ScoredSample


def _sample(
    reward: float = 0.0,
    *,
    length: int = 1,
    prompt: int = 2,
    advantage: float = 0.0,
    truncated: bool = False,
    off_policy: int = 0,
    metrics: dict[str, float] | None = None,
    timings: dict[str, float] | None = None,
) -> ScoredSample:
    return ScoredSample(
        group_id=0,
        sample_id=0,
        env_name="e",
        prompt_ids=[1] * prompt,
        completion_ids=[5] * length,
        completion_mask=[1] * length,
        reward=reward,
        advantage=advantage,
        is_truncated=truncated,
        off_policy_steps=off_policy,
        metrics=metrics or {},
        timings=timings or {},
    )


def _group(*samples: ScoredSample) -> ScoredGroup:
    return ScoredGroup(group_id=0, env_name="e", samples=list(samples))


def _dropped(reason: str, *rewards: float) -> DroppedGroup:
    return DroppedGroup(group=_group(*(_sample(r) for r in rewards)), reason=reason, step=1, version=0)


def test_gini_by_hand() -> None:
    # equal values: no inequality
    assert gini([3.0, 3.0, 3.0]) == 0.0
    # (0, 0, 0, 4): |diffs| over ordered pairs = 3 pairs * 4 * 2 = 24; 2 n^2 mean = 2*16*1 = 32
    assert gini([0.0, 0.0, 0.0, 4.0]) == pytest.approx(24 / 32)  # = (n-1)/n = 0.75
    # (1, 2, 3): pairs |1-2|+|1-3|+|2-3| = 4, ordered: 8; 2 * 9 * 2 = 36
    assert gini([1.0, 2.0, 3.0]) == pytest.approx(8 / 36)
    # all zero: 0 by definition; empty: undefined
    assert gini([0.0, 0.0]) == 0.0
    assert gini([]) is None


def test_gini_shifts_negative_values_by_their_minimum() -> None:
    # (-1, 1) -> (0, 2): ordered pairs 2 * 2 = 4; 2 * 4 * 1 = 8
    assert gini([-1.0, 1.0]) == pytest.approx(0.5)
    # (-2, -2) -> (0, 0): 0
    assert gini([-2.0, -2.0]) == 0.0
    # non-negative values are not shifted: (1, 3) gives 2*2 / (2*4*2) = 0.25, not gini(0, 2) = 0.5
    assert gini([1.0, 3.0]) == pytest.approx(0.25)


def test_cv_by_hand() -> None:
    # (2, 4, 6): mean 4, pvariance (4+0+4)/3 = 8/3, pstdev 1.63299..., cv = 0.408248...
    assert cv([2.0, 4.0, 6.0]) == pytest.approx(math.sqrt(8 / 3) / 4)
    assert cv([5.0, 5.0]) == 0.0
    assert cv([0.0, 0.0]) == 0.0
    assert cv([]) is None


def test_max_median_ratio_by_hand() -> None:
    # (1, 2, 9): median 2, max 9 -> 4.5
    assert max_median_ratio([9.0, 1.0, 2.0]) == pytest.approx(4.5)
    # (1, 3, 5, 100): median (3+5)/2 = 4 -> 25
    assert max_median_ratio([1.0, 3.0, 5.0, 100.0]) == pytest.approx(25.0)
    # median 0: undefined
    assert max_median_ratio([0.0, 0.0, 7.0]) is None
    assert max_median_ratio([]) is None


def test_stats_is_population_std_and_empty_gives_nothing() -> None:
    # (1, 3): mean 2, pstdev 1 (the sample std would be 1.414)
    assert stats("x", [1.0, 3.0]) == {"x_mean": 2.0, "x_std": 1.0, "x_min": 1.0, "x_max": 3.0}
    assert stats("x", []) == {}
    assert stats("x", [float("nan")]) == {}


def test_sample_statistics() -> None:
    # rewards 1, 0, 1, 0 -> mean 0.5, pstdev 0.5; lengths 2, 4, 6, 8 -> mean 5, pstdev sqrt(5)
    batch = RolloutBatch(
        step=1,
        groups=[
            _group(
                _sample(1.0, length=2, advantage=0.5, truncated=True, off_policy=1), _sample(0.0, length=4)
            ),
            _group(_sample(1.0, length=6, prompt=4, off_policy=3), _sample(0.0, length=8, prompt=4)),
        ],
    )
    out = derived_metrics(batch, timings={})
    assert out["derived/reward_mean"] == 0.5
    assert out["derived/reward_std"] == 0.5
    assert (out["derived/reward_min"], out["derived/reward_max"]) == (0.0, 1.0)
    assert out["derived/advantage_max"] == 0.5
    assert out["derived/length_completion_mean"] == 5.0
    assert out["derived/length_completion_std"] == pytest.approx(math.sqrt(5.0))  # (9+1+1+9)/4
    assert out["derived/length_prompt_mean"] == 3.0  # (2+2+4+4)/4
    assert out["derived/length_sum_max"] == 12.0  # 4 + 8
    assert out["derived/stop_reason_length_pct"] == 25.0  # 1 of 4
    assert out["derived/off_policy_steps_mean"] == 1.0  # (1+0+3+0)/4
    assert out["derived/off_policy_steps_std"] == pytest.approx(math.sqrt(1.5))  # (0+1+4+1)/4
    assert "derived/off_policy_steps_max" not in out


def test_length_counts_model_tokens_only() -> None:
    s = _sample(length=5)
    s.completion_mask = [1, 1, 0, 0, 1]  # 2 environment tokens in the middle
    out = derived_metrics(RolloutBatch(step=1, groups=[_group(s)]), timings={})
    assert out["derived/length_completion_mean"] == 3.0
    assert out["derived/length_sum_mean"] == 7.0  # prompt 2 + all 5 completion tokens


def test_group_homogeneity_is_the_mean_over_groups() -> None:
    # group A lengths (2, 4, 6): cv sqrt(8/3)/4 = 0.40825; gini: ordered pairs 2*(2+4+2) = 16,
    #   2 * 9 * 4 = 72 -> 0.2222; max/median 6/4 = 1.5
    # group B lengths (3, 3): cv 0, gini 0, max/median 1
    # group C lengths (0, 0, 5): cv defined (sqrt(50/9)/(5/3) = 1.41421), gini (n-1)/n = 2/3,
    #   median 0 -> left out of the ratio
    a = _group(_sample(0.0, length=2), _sample(0.0, length=4), _sample(1.0, length=6))
    b = _group(_sample(2.0, length=3), _sample(2.0, length=3))
    c = _group(_sample(-1.0, length=0), _sample(-1.0, length=0), _sample(1.0, length=5))
    out = derived_metrics(RolloutBatch(step=1, groups=[a, b, c]), timings={})
    assert out["derived/group_length_cv_mean"] == pytest.approx((math.sqrt(8 / 3) / 4 + 0 + math.sqrt(2)) / 3)
    assert out["derived/group_length_gini_mean"] == pytest.approx((16 / 72 + 0 + 2 / 3) / 3)
    assert out["derived/group_length_max_median_ratio_mean"] == pytest.approx((1.5 + 1.0) / 2)
    # reward gini: A (0, 0, 1) -> 2/3; B (2, 2) -> 0; C (-1, -1, 1) shifted to (0, 0, 2) -> 2/3
    assert out["derived/reward_gini_mean"] == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)


def test_reward_metrics_per_name() -> None:
    # correct: (1, 0) in group 1, (1) in group 2 -> mean 2/3; format only where reported
    g1 = _group(_sample(metrics={"correct": 1.0, "format": 0.5}), _sample(metrics={"correct": 0.0}))
    g2 = _group(_sample(metrics={"correct": 1.0}))
    out = derived_metrics(RolloutBatch(step=1, groups=[g1, g2]), timings={})
    assert out["derived/metric/correct_mean"] == pytest.approx(2 / 3)
    assert out["derived/metric/correct_min"] == 0.0
    # gini per group: (1, 0) -> 0.5, (1) -> 0; mean 0.25
    assert out["derived/metric/correct_gini_mean"] == pytest.approx(0.25)
    assert out["derived/metric/format_mean"] == 0.5
    assert out["derived/metric/format_std"] == 0.0


def test_discarded_breakdown() -> None:
    # 5 discarded: 3 zero_advantage (all 0 / all 1 / all 0.5), 1 max_async, 1 rollout_error
    batch = RolloutBatch(
        step=1,
        groups=[],
        discarded=[
            _dropped("zero_advantage", 0.0, 0.0),
            _dropped("zero_advantage", 1.0, 1.0),
            _dropped("zero_advantage", 0.5, 0.5),
            _dropped("max_async", 1.0, 0.0),
            _dropped("rollout_error", 0.0),
        ],
        cancelled=[_dropped("eval_drain", 0.0), _dropped("eval_drain", 1.0)],
    )
    out = derived_metrics(batch, timings={})
    assert out["derived/discarded_count"] == 5
    assert out["derived/discarded/zero_advantage_count"] == 3
    assert out["derived/discarded/max_async_count"] == 1
    assert out["derived/discarded/rollout_error_count"] == 1
    assert out["derived/discarded/off_policy_count"] == 0  # a core reason, reported when absent
    assert out["derived/discarded_zero_advantage_pct"] == 60.0  # 3 of 5
    assert out["derived/discarded_max_async_pct"] == 20.0  # 1 of 5
    assert out["derived/discarded_zero_advantage_all_zero_pct"] == pytest.approx(100 / 3)  # 1 of 3
    assert out["derived/discarded_zero_advantage_all_positive_pct"] == pytest.approx(200 / 3)  # 2 of 3
    assert out["derived/cancelled_count"] == 2
    assert "derived/discarded/eval_drain_count" not in out  # cancelled groups are not discarded ones


def test_empty_batch_gives_counts_and_no_nan() -> None:
    out = derived_metrics(RolloutBatch(step=1, groups=[]), timings={})
    assert out == {
        "derived/discarded_count": 0.0,
        "derived/discarded/max_async_count": 0.0,
        "derived/discarded/off_policy_count": 0.0,
        "derived/discarded/zero_advantage_count": 0.0,
        "derived/cancelled_count": 0.0,
    }
    # a group with no samples defines nothing either
    out = derived_metrics(RolloutBatch(step=1, groups=[_group()]), timings={"step_s": 0.0})
    assert not any(math.isnan(v) for v in out.values())
    assert "derived/reward_mean" not in out
    assert "derived/group_length_cv_mean" not in out
    assert not any(k.startswith("derived/timing/") for k in out)


def test_timing_shares() -> None:
    # step 10 s, train 4 s, weight sync 1 s -> 40 %, 10 %, idle (10-4-1)/10 = 50 %
    # generation: 5/10 = 50 %, 20/10 capped at 100 %, one sample without it -> mean 75 %
    # reward: 1/10 = 10 % (the only sample with it)
    g = _group(
        _sample(timings={"generation_s": 5.0, "reward_s": 1.0}),
        _sample(timings={"generation_s": 20.0}),
        _sample(),
    )
    out = derived_metrics(
        RolloutBatch(step=1, groups=[g]), timings={"step_s": 10.0, "train_s": 4.0, "weight_sync_s": 1.0}
    )
    assert out["derived/timing/train_pct"] == 40.0
    assert out["derived/timing/weight_sync_pct"] == 10.0
    assert out["derived/timing/idle_pct"] == 50.0
    assert out["derived/timing/generation_pct"] == 75.0
    assert out["derived/timing/reward_pct"] == 10.0
    # idle is clipped at 0 when train + sync exceed the step
    out = derived_metrics(RolloutBatch(step=1, groups=[]), timings={"step_s": 2.0, "train_s": 3.0})
    assert out["derived/timing/idle_pct"] == 0.0
    assert "derived/timing/generation_pct" not in out


@dataclass
class _MiniSample:
    reward: float
    advantage: float = 0.0
    prompt_ids: tuple[int, ...] = (1,)
    completion_ids: tuple[int, ...] = (2, 3)
    completion_mask: tuple[int, ...] = ()
    is_truncated: bool = False
    off_policy_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class _MiniGroup:
    samples: list[_MiniSample]


@dataclass
class _MiniBatch:
    groups: list[_MiniGroup]
    discarded: list[object] = field(default_factory=list)
    cancelled: list[object] = field(default_factory=list)


def test_any_objects_with_the_fields_do() -> None:
    batch = _MiniBatch(groups=[_MiniGroup([_MiniSample(1.0), _MiniSample(3.0)])])
    out = _derived.derived_metrics(batch, timings={})  # pyright: ignore[reportArgumentType]
    assert out["derived/reward_mean"] == 2.0
    assert out["derived/length_completion_mean"] == 2.0  # no mask: len(completion_ids)
