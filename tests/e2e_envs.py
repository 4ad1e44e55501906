"""Environments of the end-to-end tests (``telescope train`` imports them as ``e2e_envs:<Class>``).

- ``DigitsEnv``: reward = the share of digits among a completion's characters, so even a random
  tiny model's groups have spread, and a model that learns writes more digits.
- ``SlowDigitsEnv``: the same reward after two seconds (asynchronously), so an eval of it outlasts
  a training step of the tiny model.
- ``LongPromptEnv``: every prompt is far longer than the tests' ``max_model_len``.
- ``BrokenRewardEnv``: every reward raises the same error (a grader that is down).
"""

from __future__ import annotations

import asyncio
from typing import Any

from telescope_rollout import RewardResult, Sample, SingleTurnEnvironment


class DigitsEnv(SingleTurnEnvironment):
    """Reward: the share of digits among the completion's characters (spread even for noise)."""

    reward_min = 0.0
    reward_max = 1.0

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        samples = [Sample(f"Count to {n}.", str(n)) for n in range(50)]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        share = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return RewardResult(share, {"digits": share})


class SlowDigitsEnv(DigitsEnv):
    """``DigitsEnv`` whose reward takes two seconds (without blocking the event loop)."""

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        await asyncio.sleep(2.0)
        return super().compute_reward(completion, sample, eos_token)


class LongPromptEnv(SingleTurnEnvironment):
    """Prompts of 3,000 words: no context of the tests holds one."""

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        samples = [Sample("tell me more " * 1000 + str(n), str(n)) for n in range(20)]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(0.0, {})


class BrokenRewardEnv(DigitsEnv):
    """Every reward raises: the run can never assemble a batch."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        raise RuntimeError("the grader is down")
