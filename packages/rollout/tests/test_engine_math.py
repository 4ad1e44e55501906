"""The engine's math comes from its caller: ``advantage_fn`` (here the torch-free advantages of
``telescope_rollout.testing``), the optional ``reward_shaping``, and its own zero-advantage rule."""

from __future__ import annotations

import pytest
from engine_fakes import by_sample_parity, make_engine

from telescope_rollout import RolloutError, ScoredSample
from telescope_rollout.engine._groups import is_zero_advantage
from telescope_rollout.testing import FakeInferenceServer, group_advantages


def test_group_advantages_hand_worked():
    # grpo [1, 0]: mean .5, std (ddof 1) sqrt(.5) = .70711 -> ±.5 / .70721
    assert group_advantages([1.0, 0.0], algorithm="grpo") == pytest.approx(
        [0.5 / (0.5**0.5 + 1e-4), -0.5 / (0.5**0.5 + 1e-4)]
    )
    # rloo [3, 1, 2]: 3 - 1.5, 1 - 2.5, 2 - 2
    assert group_advantages([3.0, 1.0, 2.0], algorithm="rloo") == pytest.approx([1.5, -1.5, 0.0])
    assert group_advantages([3.0, 1.0], algorithm="dr_grpo") == pytest.approx([1.0, -1.0])
    assert group_advantages([2.0], algorithm="grpo", advantage_norm="batch") == [2.0]
    with pytest.raises(ValueError, match="not defined for rloo"):
        group_advantages([1.0, 0.0], algorithm="rloo", advantage_norm="batch")
    with pytest.raises(ValueError, match="unknown algorithm"):
        group_advantages([1.0, 0.0], algorithm="ppo")


def test_zero_advantage_rule():
    assert is_zero_advantage([0.3, 0.3 + 1e-12])
    assert not is_zero_advantage([0.0])
    assert not is_zero_advantage([0.0, 1e-6])


async def test_reward_shaping_comes_before_the_advantages(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)  # rewards 0, 1 in every group
    seen: list[list[float]] = []

    def advantages(rewards: list[float]) -> list[float]:
        seen.append(list(rewards))
        return group_advantages(rewards)

    def shaping(sample: ScoredSample) -> float:
        return sample.reward - 0.25 * sample.num_model_tokens  # 2 model tokens each

    engine = make_engine(tokenizer, server, advantage_fn=advantages, reward_shaping=shaping)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    (group,) = batch.groups
    assert [s.reward for s in group.samples] == [-0.5, 0.5]
    assert seen[0] == [-0.5, 0.5]
    assert [s.advantage for s in group.samples] == pytest.approx(group_advantages([-0.5, 0.5]))


async def test_a_raising_advantage_fn_stops_the_engine(tokenizer):
    def broken(rewards: list[float]) -> list[float]:
        raise ValueError("advantage_norm='batch' is not defined for rloo")

    engine = make_engine(tokenizer, FakeInferenceServer(reply=by_sample_parity), advantage_fn=broken)
    async with engine:
        with pytest.raises(RolloutError, match="advantage_fn raised ValueError"):
            await engine.next_batch(timeout_s=10)


async def test_advantage_fn_must_give_one_advantage_per_sample(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, group_size=2, advantage_fn=lambda rewards: [0.0])
    async with engine:
        with pytest.raises(RolloutError, match="returned 1 advantages for 2 rewards"):
            await engine.next_batch(timeout_s=10)
