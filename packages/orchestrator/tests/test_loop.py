"""The loop's pure parts: reward metrics, output filters, batch whitening and the row padding."""

from __future__ import annotations

import pytest

from telescope_config.testing import make_config
from telescope_orchestrator.run.loop import reward_metrics, to_train_samples
from telescope_orchestrator.run.wiring import engine_math
from telescope_rollout import DroppedGroup, RolloutBatch, ScoredGroup, ScoredSample


def _group(gid: int, env: str, rewards: list[float], advantages: list[float] | None = None) -> ScoredGroup:
    advantages = advantages or [0.0] * len(rewards)
    samples = [
        ScoredSample(
            group_id=gid, sample_id=gid * 10 + i, env_name=env, prompt_ids=[1, 2], completion_ids=[3, 4, 5],
            completion_mask=[1, 1, 1], completion_logprobs=[-0.1, -0.2, -0.3], reward=r, advantage=a,
            finish_reason="stop", completion_text="42",
        )
        for i, (r, a) in enumerate(zip(rewards, advantages, strict=True))
    ]  # fmt: skip
    return ScoredGroup(group_id=gid, env_name=env, samples=samples)


def test_reward_mean_counts_scored_drops_but_not_cancelled_or_errors():
    batch = RolloutBatch(
        step=1,
        groups=[_group(0, "a", [1.0, 0.0])],
        discarded=[
            DroppedGroup(_group(1, "b", [1.0, 1.0]), "zero_advantage", 1, 0),
            DroppedGroup(_group(2, "b", [0.0, 0.0]), "rollout_error", 1, 0),
        ],
        cancelled=[DroppedGroup(_group(3, "a", [0.0, 0.0]), "off_policy", 1, 0)],
    )
    m = reward_metrics(batch)
    # scored: a -> [1, 0], b -> [1, 1]; mean (1 + 0 + 1 + 1) / 4 = 0.75
    assert m["reward/mean"] == pytest.approx(0.75)
    assert m["reward/kept_mean"] == pytest.approx(0.5)
    assert m["reward/a/mean"] == pytest.approx(0.5)
    assert m["reward/b/mean"] == pytest.approx(1.0)


def _config(**kw):
    base = dict(
        advantage_norm="group", algorithm="grpo", filter_overlong=False, filter_gibberish=False,
        filter_repetition=False, gibberish_token_threshold=100_000, gibberish_logprob_offset=2.0,
        repetition_compression_threshold=10.0,
    )  # fmt: skip
    base.update(kw)
    return make_config(**base)


def test_overlong_filter_zeroes_the_loss_mask_and_is_counted():
    group = _group(0, "a", [1.0, 0.0], [1.0, -1.0])
    group.samples[1].finish_reason = "length"
    samples, stats = to_train_samples(RolloutBatch(step=1, groups=[group]), _config(filter_overlong=True))
    assert samples[0].completion_mask is not None
    assert samples[1].completion_mask is not None
    assert list(samples[0].completion_mask) == [1, 1, 1]
    assert list(samples[1].completion_mask) == [0, 0, 0]
    assert stats["filter/overlong_frac"] == pytest.approx(0.5)
    assert [s.advantage for s in samples] == [1.0, -1.0]


def test_batch_norm_whitens_over_the_kept_samples():
    # centred group advantages [1, -1] and [3, -3]: mean 0, sample std (ddof=1)
    # sqrt((1 + 1 + 9 + 9) / 3) = sqrt(20 / 3) ≈ 2.582
    batch = RolloutBatch(
        step=1, groups=[_group(0, "a", [1, 0], [1.0, -1.0]), _group(1, "a", [1, 0], [3.0, -3.0])]
    )
    samples, _ = to_train_samples(batch, _config(advantage_norm="batch"))
    std = (20 / 3) ** 0.5 + 1e-4  # plus the epsilon of telescope-algos (1e-4)
    assert [s.advantage for s in samples] == pytest.approx([1 / std, -1 / std, 3 / std, -3 / std], rel=1e-5)


def _advantage_fn(algorithm: str, advantage_norm: str):
    return engine_math(
        _config(algorithm=algorithm, advantage_norm=advantage_norm, overlong_penalty_factor=0.0)
    )[0]


def test_group_advantages_come_from_telescope_algos():
    # GRPO: rewards [1, 0, 0, 1] -> centred [0.5, -0.5, -0.5, 0.5] over the group's std: signs alternate
    adv = _advantage_fn("grpo", "group")([1.0, 0.0, 0.0, 1.0])
    assert adv[0] == pytest.approx(-adv[1])
    assert adv[0] > 0
    assert _advantage_fn("grpo", "batch")([1.0, 0.0]) == pytest.approx([0.5, -0.5])  # centred only
    assert _advantage_fn("rloo", "group")([1.0, 0.0, 0.0]) == pytest.approx([1.0, -0.5, -0.5])


def test_the_overlong_penalty_comes_from_telescope_algos():
    cfg = _config(overlong_penalty_factor=2.0, overlong_buffer_tokens=10, max_tokens=100)
    _, shaping = engine_math(cfg)
    assert shaping is not None
    assert engine_math(_config(overlong_penalty_factor=0.0))[1] is None  # off: no shaping at all

    def sample(reward: float, model_tokens: int) -> ScoredSample:
        return ScoredSample(0, 0, "a", completion_mask=[1] * model_tokens + [0] * 7, reward=reward)

    # L = 95, Lmax = 100, B = 10: excess 5 -> -5/10 * 2 = -1
    assert shaping(sample(1.0, 95)) == pytest.approx(0.0)
    assert shaping(sample(1.0, 90)) == 1.0


async def test_a_step_is_lent_the_servers_cores_once_they_stay_quiet_until_its_update(tmp_path):
    import asyncio
    import time
    from types import SimpleNamespace
    from typing import Any, cast

    from telescope_orchestrator.cluster.cores import CoreLease
    from telescope_orchestrator.run.loop import LEND_POLL_S, LEND_SETTLE_S, _lend_cores

    lease = CoreLease(tmp_path / "lease")
    engine = SimpleNamespace(idle=False)
    evals = SimpleNamespace(idle=False)
    supervisor = SimpleNamespace(restarting=True)
    ctx = cast(Any, SimpleNamespace(rollout=engine, eval_schedule=evals, supervisor=supervisor, cores=lease))
    task = asyncio.create_task(_lend_cores(ctx, 4))
    for quiet in (engine, evals):  # the engine waits for the update, an eval and a restart go on
        await asyncio.sleep(LEND_POLL_S * 2)
        quiet.idle = True
    await asyncio.sleep(LEND_SETTLE_S + LEND_POLL_S * 2)
    assert lease.granted == 0
    supervisor.restarting = False
    await asyncio.sleep(LEND_POLL_S * 3)
    engine.idle = False  # a moment of quiet shorter than LEND_SETTLE_S lends nothing
    await asyncio.sleep(LEND_SETTLE_S)
    assert lease.granted == 0
    engine.idle = True
    t0 = time.monotonic()
    await asyncio.wait_for(task, timeout=5)
    assert time.monotonic() - t0 >= LEND_SETTLE_S - LEND_POLL_S
    assert lease.granted == 4
    lease.revoke()  # the step's training ended: a step trained again finds no grant
    assert lease.granted == 0
    lease.close()
