"""The batch-progress tally and its line, worked by hand."""

from __future__ import annotations

import math

from telescope_rollout.engine._progress import (
    DISTINCT,
    BatchProgress,
    RewardTally,
    progress_line,
    rewards_summary,
)


def tally(*rewards: float) -> RewardTally:
    t = RewardTally()
    for r in rewards:
        t.add(r)
    return t


def test_a_tally_keeps_range_mean_and_each_value_until_too_many():
    t = tally(0.0, 1.0, 0.0, 0.5)
    assert (t.groups, t.low, t.high, t.mean) == (4, 0.0, 1.0, 0.375)
    assert t.values == {0.0: 2, 1.0: 1, 0.5: 1}
    many = tally(*(i / 100 for i in range(DISTINCT + 2)))
    assert len(many.values) == DISTINCT
    assert many.overflow
    assert math.isnan(RewardTally().mean)
    assert tally(float("nan")).describe() == "1 group scored nan"  # a broken reward is shown, not raised on


def test_a_tally_says_its_rewards_in_words():
    assert RewardTally().describe() == "no group finished yet"
    assert tally(0.0).describe() == "the group scored 0.0"
    assert tally(0.0, 0.0, 0.0).describe() == "every group scored 0.0"
    assert tally(0.0, 1.0, 0.0).describe() == "2 groups scored 0.0, 1 scored 1.0"
    assert tally(0.25, 0.25).describe("sample") == "every sample scored 0.25"
    # four distinct values: the range and the mean, (0 + 0.1 + 0.2 + 0.5) / 4 = 0.2
    assert tally(0.0, 0.1, 0.2, 0.5).describe() == "groups scored 0.000 to 0.500 (mean 0.200)"


def test_the_rewards_summary_is_per_environment_when_there_are_several():
    assert rewards_summary({}) == "no group finished yet"
    assert rewards_summary({"a": tally(0.0, 0.0)}) == "every finished group scored 0.0"
    both = rewards_summary({"b": tally(0.0, 0.0), "a": tally(0.0, 1.0)})
    assert both == "a: 1 group scored 0.0, 1 scored 1.0; b: every group scored 0.0"


def test_the_progress_line():
    dropped = {"zero_advantage": 12, "sample_error": 2}
    p = BatchProgress(2, 0, 2, dropped, {}, 4, {"count": tally(0.0, 0.0)})
    assert progress_line(p) == (
        "kept 0/2 groups, dropped 14 (zero_advantage 12, sample_error 2), 4 in flight; "
        "every finished group scored 0.0"
    )
    assert "held back" not in progress_line(p)
    q = BatchProgress(1, 1, 4, {}, {"max_async": 3}, 0, {})
    assert (
        progress_line(q) == "kept 1/4 groups, cancelled 3 (max_async 3), 0 in flight; no group finished yet"
    )
