"""Engine test doubles shared by test_engine.py and test_engine_drain.py: an echo environment,
a reply function with reward spread in every group, an environment whose rewards wait on a gate,
and an engine on a fake server."""

from __future__ import annotations

import asyncio
from typing import Any

from telescope_rollout import (
    EngineSettings,
    MultiEnvSampler,
    RewardResult,
    RolloutEngine,
    Sample,
    SamplerEntry,
    SingleTurnEnvironment,
)
from telescope_rollout.testing import FakeRequest, group_advantages, sample_ids


class EchoEnv(SingleTurnEnvironment):
    """Prompts ``q<i>``; reward = the completion text as a number."""

    n = 8
    long_index: int | None = None
    fail_index: int | None = None

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        samples = []
        for i in range(self.n):
            text = "word " * 600 if i == self.long_index else f"q{i}"
            samples.append(Sample(text, str(i)))
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if sample.metadata["_index"] == self.fail_index:
            raise RuntimeError("reward crashed")
        return RewardResult(float(completion), {"len": float(len(completion))})


class GatedRewardEnv(EchoEnv):
    """:class:`EchoEnv` whose rewards wait until ``gate`` is set (a slow grader, a stuck teacher)."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        await self.gate.wait()
        return RewardResult(float(completion))


def by_sample_parity(req: FakeRequest) -> tuple[str, list[int]]:
    """Reward 0 for even sample ids, 1 for odd: every group of size >= 2 has spread."""
    sid = sample_ids([req])[0]
    return str(sid % 2), [10 + sid % 2, 3]


def make_engine(
    tokenizer,
    server,
    *,
    env=None,
    clock=None,
    advantage_fn=group_advantages,
    reward_shaping=None,
    scorers=(),
    **overrides,
) -> RolloutEngine:
    env = env if env is not None else EchoEnv()
    env.load_dataset()
    base = dict(
        group_size=2, prompts_batch_size_for_trainer=1, max_concurrent_prompts_per_server=2,
        max_async_rollout=10, max_tokens=16, max_model_len=256, enable_prompt_prefetch=False,
        enable_thinking=None,
    )  # fmt: skip
    settings = EngineSettings(**{**base, **overrides})
    sampler = MultiEnvSampler([SamplerEntry("echo", 1.0, len(env))], seed=0)
    return RolloutEngine(
        settings, environments={"echo": env}, sampler=sampler, tokenizer=tokenizer, client=server,
        advantage_fn=advantage_fn, reward_shaping=reward_shaping, clock=clock, scorers=scorers,
    )  # fmt: skip
