"""The two result types of the environment API: a reward result and eval metrics are not interchangeable."""

from __future__ import annotations

import pytest

from telescope_rollout import RewardResult
from telescope_rollout.envs import EvalMetricsResult
from telescope_rollout.envs._env import as_reward_result


def test_eval_metrics_carry_metrics_and_no_reward():
    r = EvalMetricsResult({"correct": 1.0}, {"correct": "42"})
    assert r.metrics == {"correct": 1.0}
    assert r.golden_answers == {"correct": "42"}
    assert r.total_reward == 0.0
    r.metrics = {"correct": 0.0}
    assert r.metrics == {"correct": 0.0}


def test_compute_reward_may_not_return_eval_metrics():
    assert as_reward_result(0.5) == RewardResult(total_reward=0.5)
    with pytest.raises(TypeError, match="got an EvalMetricsResult"):
        as_reward_result(EvalMetricsResult({"correct": 1.0}))
