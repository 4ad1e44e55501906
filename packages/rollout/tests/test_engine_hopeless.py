"""The engine never spins on input that can only fail again: prompts that cannot fit the context are
dropped at dispatch and a hopeless environment stops the run; groups that all fail with one error
stop it too, and so do groups whose rewards never vary (an environment alone in that state is
named); dropped groups kept for records are capped. Driven with the in-process fake server;
every wait is bounded by ``asyncio.wait_for`` so a regression fails instead of hanging."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from engine_fakes import EchoEnv, by_sample_parity, make_engine

from telescope_rollout import (
    EngineSettings,
    MultiEnvSampler,
    MultiTurnEnvironment,
    RewardResult,
    RolloutEngine,
    RolloutError,
    Sample,
    SamplerEntry,
)
from telescope_rollout.inference import PromptTooLongError, ServerUnavailableError
from telescope_rollout.testing import FakeInferenceServer, group_advantages, sample_ids, settle

A, B = "http://a", "http://b"


class LongEnv(EchoEnv):
    """Every prompt is too long for max_model_len 256: prompt i has 300 + 20 * (i % 10) words."""

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        samples = [Sample("word " * (300 + 20 * (i % 10)), str(i)) for i in range(self.n)]
        return self._set_samples(samples, num_samples)


class EveryThirdLong(EchoEnv):
    """Prompts 0, 3, 6 are too long for max_model_len 256; the others fit."""

    n = 9

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        samples = [Sample("word " * 600 if i % 3 == 0 else f"q{i}", str(i)) for i in range(self.n)]
        return self._set_samples(samples, num_samples)


def prompt_len(tokenizer, env, i: int) -> int:
    return len(tokenizer.encode(env.format_prompt(env.get_sample(i).prompt, tokenizer)))


def two_env_engine(tokenizer, server, envs: dict[str, Any], **overrides) -> RolloutEngine:
    for env in envs.values():
        env.load_dataset()
    base = dict(
        group_size=2, prompts_batch_size_for_trainer=1, max_concurrent_prompts_per_server=2,
        max_async_rollout=10, max_tokens=16, max_model_len=256, enable_prompt_prefetch=False,
        enable_thinking=None,
    )  # fmt: skip
    sampler = MultiEnvSampler([SamplerEntry(n, 1.0, len(e)) for n, e in envs.items()], seed=0)
    return RolloutEngine(
        EngineSettings(**{**base, **overrides}), environments=envs, sampler=sampler,
        tokenizer=tokenizer, client=server, advantage_fn=group_advantages,
    )  # fmt: skip


async def batches_until_error(engine: RolloutEngine, limit_s: float = 10.0) -> tuple[int, RolloutError]:
    """How many batches came before ``next_batch`` raised, and the error (fails after ``limit_s``)."""
    got = 0

    async def drain() -> RolloutError:
        nonlocal got
        while True:
            try:
                await engine.next_batch(timeout_s=None)
            except RolloutError as exc:
                return exc
            got += 1

    err = await asyncio.wait_for(drain(), limit_s)
    return got, err


async def test_an_environment_with_no_prompt_that_fits_stops_at_once_without_a_request(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, env=LongEnv(n=4))
    env = engine.environments["echo"]
    lengths = [prompt_len(tokenizer, env, i) for i in range(4)]
    assert min(lengths) >= 256
    t0 = time.monotonic()
    async with engine:
        with pytest.raises(RolloutError) as info:
            await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
        elapsed = time.monotonic() - t0
        with pytest.raises(RolloutError):  # it stays failed
            await asyncio.wait_for(engine.next_batch(timeout_s=None), 1)
    msg = str(info.value)
    assert msg.startswith("environment 'echo' has no prompt that fits the context: none of the last ")
    assert "(they are all 4 of its training prompts)" in msg
    assert f"The longest has {max(lengths)} prompt tokens, the shortest {min(lengths)};" in msg
    assert "below max_model_len (256)" in msg
    assert "max_tokens (16) is not the cause" in msg
    assert f"raise max_model_len to at least {max(lengths) + 16}" in msg
    assert "\n" not in msg
    assert "Traceback" not in msg
    assert server.requests == []
    assert engine.in_flight_groups == 0
    assert elapsed < 5


class LongGame(MultiTurnEnvironment):
    """One multi-turn episode whose first prompt is too long."""

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("word " * 400)], num_samples)

    def env_response(self, messages, state):
        return [{"role": "user", "content": "again"}]

    def compute_reward(self, state, eos_token=""):
        return 0.0


async def test_a_multi_turn_first_prompt_that_cannot_fit_is_caught_at_dispatch(tokenizer):
    server = FakeInferenceServer()
    engine = make_engine(tokenizer, server, env=LongGame())
    async with engine:
        with pytest.raises(RolloutError) as info:
            await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
    msg = str(info.value)
    assert "environment 'echo' has no prompt that fits the context: the prompt drawn from it" in msg
    assert "(it has only this one training prompt)" in msg
    assert server.requests == []


async def test_one_hopeless_environment_next_to_a_fine_one_stops_the_run_naming_it(tokenizer):
    # an environment with no prompt that fits stops the run even when another one trains fine
    server = FakeInferenceServer(reply=by_sample_parity)
    envs = {"long": LongEnv(n=1000), "echo": EchoEnv()}
    engine = two_env_engine(tokenizer, server, envs, max_async_rollout=1000)  # no weight updates here
    async with engine:
        got, err = await batches_until_error(engine)
    msg = str(err)
    assert msg.startswith("environment 'long' has no prompt that fits the context: none of the last 32")
    assert "(32 in a row, of its 1000 training prompts; if only some are too long, raise " in msg
    assert "max_consecutive_unfit_prompts (now 32))" in msg
    assert got > 0  # the fine environment trained until then
    assert server.requests
    assert all(len(r.prompt) < 256 for r in server.requests)


async def test_prompts_that_do_not_fit_are_dropped_at_dispatch_and_recorded(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, env=EveryThirdLong(), prompts_batch_size_for_trainer=2)
    env = engine.environments["echo"]
    assert isinstance(env, EveryThirdLong)
    async with engine:
        batches = [await engine.next_batch(timeout_s=10) for _ in range(5)]
    kept = [g for b in batches for g in b.groups]
    unfit = [d for b in batches for d in b.discarded if d.reason == "prompt_too_long"]
    assert len(kept) == 10
    assert all(g.sample_index % 3 != 0 for g in kept)
    assert unfit
    assert {d.reason for b in batches for d in b.discarded} == {"prompt_too_long"}
    assert sum(b.metrics.get("rollout/discarded_prompt_too_long", 0) for b in batches) == len(unfit)
    for d in unfit:
        assert d.group.sample_index % 3 == 0
        text = env.format_prompt(env.get_sample(d.group.sample_index).prompt, tokenizer)
        n = len(tokenizer.encode(text))
        assert d.group.prompt_text == text
        assert len(d.group.samples) == 2
        for s in d.group.samples:
            assert (s.env_name, s.prompt_text, s.prompt_ids) == ("echo", text, tokenizer.encode(text))
            assert s.error == "prompt_too_long"
            assert s.error_detail == f"{n} prompt tokens leave no room below max_model_len 256"
            assert s.server == ""  # no server, no lane
            assert s.lane == -1
    assert all(len(r.prompt) < 256 for r in server.requests)
    # sample ids stay unique across kept and dropped groups
    ids = [s.sample_id for g in [*kept, *(d.group for d in unfit)] for s in g.samples]
    assert len(ids) == len(set(ids))


class NoSandboxEnv(EchoEnv):
    def compute_reward(self, completion, sample, eos_token=""):
        raise RuntimeError("echo needs a sandbox: none was given")


async def test_every_reward_raising_the_same_error_stops_the_run(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, env=NoSandboxEnv())
    async with engine:
        with pytest.raises(RolloutError) as info:
            await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
        await settle()
        sent = len(server.requests)
        await settle()
        assert len(server.requests) == sent  # dispatch stopped
    # prompts_batch_size_for_trainer 1: max(2 * 1, 8) = 8 groups
    assert str(info.value) == (
        "every sample of the last 8 groups failed with sample_error (environment echo): "
        "compute_reward raised RuntimeError: echo needs a sandbox: none was given; the run cannot "
        "make progress. Fix the cause above (the environment, its resources or the servers) and start again."
    )
    assert sent < 40


async def test_a_server_refusing_every_prompt_as_too_long_stops_the_run(tokenizer):
    # the prompt fits by our count (budget > 0) but the server refuses it: the per-sample path
    def refuse(req):
        raise PromptTooLongError(len(req.prompt), 20, req.url)

    server = FakeInferenceServer(reply=refuse)
    engine = make_engine(tokenizer, server, max_model_len=64)
    async with engine:
        with pytest.raises(RolloutError) as info:
            await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
    msg = str(info.value)
    head = "every sample of the last 8 groups failed with prompt_too_long (environment echo): "
    assert msg.startswith(head)
    assert ", the context holds 20; the run cannot make progress." in msg
    assert server.requests


@pytest.mark.parametrize(
    ("failures", "reasons"),
    [
        # group g % 3 == 0 fails the request, g % 3 == 1 fails scoring, g % 3 == 2 works
        ({0: "request", 1: "reward"}, {"rollout_error", "sample_error"}),
        # two groups in three fail scoring: 8 of them come within 12 groups, but kept ones in between
        ({0: "reward", 1: "reward"}, {"sample_error"}),
    ],
)
async def test_transient_errors_still_give_batches(tokenizer, failures, reasons):
    def flaky(req):  # group = sample id // group_size
        how = failures.get(sample_ids([req])[0] // 2 % 3)
        if how == "request":
            raise RuntimeError("connection reset (fake)")
        return ("boom", [5]) if how == "reward" else by_sample_parity(req)

    server = FakeInferenceServer(reply=flaky)
    engine = make_engine(tokenizer, server, max_async_rollout=100)
    async with engine:
        batches = [await asyncio.wait_for(engine.next_batch(timeout_s=None), 10) for _ in range(12)]
    assert all(len(b.groups) == 1 for b in batches)
    assert {g.group_id % 3 for b in batches for g in b.groups} == {2}
    assert {d.reason for b in batches for d in b.discarded} == reasons
    assert sum(len(b.discarded) for b in batches) >= 2 * 11


async def test_groups_failing_on_an_unreachable_server_do_not_stop_the_run(tokenizer):
    # 8 groups fail at once on server a (gone) while b keeps training: the pool's rule decides,
    # not the same-error one
    def gone_on_a(req):
        if req.url == A:
            raise ServerUnavailableError(f"{A}: connection refused (fake)", A)
        return by_sample_parity(req)

    server = FakeInferenceServer(server_urls=[A, B], reply=gone_on_a, hold=lambda r: True)
    engine = make_engine(tokenizer, server, max_concurrent_prompts_per_server=8)
    async with engine:
        await settle()
        assert len([r for r in server.pending if r.url == A]) == 16
        server.release(lambda r: r.url == A)
        await settle()
        assert engine.pool.down.keys() == {A}
        server.hold = None
        server.release()
        batch = await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
    assert batch.groups[0].server == B
    assert len([d for d in batch.discarded if d.reason == "rollout_error"]) == 8


async def test_dropped_groups_kept_for_records_are_capped_and_the_rest_counted(tokenizer):
    # groups 0..99 (sample ids < 200) get one reward each: zero_advantage; then rewards spread
    def late_spread(req):
        return ("1", [5]) if sample_ids([req])[0] < 200 else by_sample_parity(req)

    server = FakeInferenceServer(reply=late_spread)
    engine = make_engine(tokenizer, server, max_zero_advantage_batches=0)  # 100 flat groups: no stop
    assert engine.bucket.max_recorded == 4 * 1 + 64
    async with engine:
        batch = await asyncio.wait_for(engine.next_batch(timeout_s=None), 10)
    assert [d.group.group_id for d in batch.discarded] == list(range(68))
    assert batch.metrics["rollout/groups_discarded"] == 68.0
    assert batch.metrics["rollout/discarded_zero_advantage"] == 100.0
    assert batch.metrics["rollout/discarded_unrecorded"] == 32.0
    assert engine.pending_drops() == ([], [])  # handed out with the batch


def constant(req) -> tuple[str, list[int]]:
    """Every completion is "0": every group's rewards are one value."""
    return "0", [10, 3]


async def test_groups_whose_rewards_never_vary_stop_the_run_with_what_was_seen(tokenizer):
    server = FakeInferenceServer(reply=constant)
    engine = make_engine(tokenizer, server, prompts_batch_size_for_trainer=2, max_zero_advantage_batches=3)
    events: list[Any] = []
    engine.on_event = events.append
    async with engine:
        got, err = await batches_until_error(engine)
        await settle()
        sent = len(server.requests)
        await settle()
        assert len(server.requests) == sent  # dispatch stopped
        progress = engine.progress()
        discarded, cancelled = engine.pending_drops()
    assert got == 0
    msg = str(err)
    # 3 batches' worth of 2 groups = 6 groups
    assert msg.startswith("no group was kept in the last 6 groups: every one was dropped for zero advantage")
    assert "every finished group scored 0.0" in msg
    assert "discard_group_zero_advantage: false" in msg
    assert "max_zero_advantage_batches (now 3" in msg
    # what the batch being filled saw: nothing kept, the six drops (recorded, times real)
    assert (progress.kept, progress.needed, progress.dropped) == (0, 2, {"zero_advantage": 6})
    assert progress.rewards["echo"].describe() == "every group scored 0.0"
    assert [d.reason for d in discarded] == ["zero_advantage"] * 6
    assert cancelled == []
    for d in discarded:
        assert all(
            s.finished_at and s.dispatched_at and s.finished_at >= s.dispatched_at for s in d.group.samples
        )
    assert not [e for e in events if e.kind == "environment_flat"]  # one environment: the stop says it


async def test_a_flat_environment_beside_a_fine_one_is_named_and_the_run_goes_on(tokenizer):
    class FlatEnv(EchoEnv):
        def compute_reward(self, completion, sample, eos_token=""):
            return RewardResult(0.0, {})  # a parser that never matches

    engine = two_env_engine(
        tokenizer,
        FakeInferenceServer(reply=by_sample_parity),
        {"flat": FlatEnv(), "echo": EchoEnv()},
        max_zero_advantage_batches=6,
        max_async_rollout=1000,
    )
    events: list[Any] = []
    engine.on_event = events.append
    async with engine:
        batches = [await asyncio.wait_for(engine.next_batch(timeout_s=None), 10) for _ in range(20)]
    assert {g.env_name for b in batches for g in b.groups} == {"echo"}  # flat trains nothing
    named = [e for e in events if e.kind == "environment_flat"]
    assert named, "the flat environment was never named"
    # the sampler's seed fixes the order: never 6 flat groups in a row, the run goes on
    assert named[0].detail["env"] == "flat"
    assert named[0].detail["groups"] == 6
    assert named[0].detail["message"].startswith("environment 'flat' trains nothing: its last 6 groups")
    assert [e.detail["groups"] for e in named] == [6 * (i + 1) for i in range(len(named))]


async def test_dropping_prompts_at_dispatch_lets_other_tasks_run(tokenizer):
    # every prompt is unfit (max_model_len 8); 2000 are dropped before the run stops
    env = EchoEnv()
    env.n = 5000
    server = FakeInferenceServer()
    engine = make_engine(
        tokenizer, server, env=env, max_model_len=8, max_consecutive_unfit_prompts=2000,
        enable_prompt_prefetch=True,
    )  # fmt: skip
    assert min(prompt_len(tokenizer, env, i) for i in range(20)) >= 8
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    try:
        async with engine:
            with pytest.raises(RolloutError, match="none of the last 2000 prompts"):
                await asyncio.wait_for(engine.next_batch(timeout_s=None), 30)
            assert len(engine.pending_drops()[0]) == 68  # memory stays bounded
            assert engine.bucket.unrecorded("discarded") == 2000 - 68
    finally:
        tick_task.cancel()
    assert ticks >= 1000
    assert server.requests == []


def test_the_start_up_check_names_an_environment_whose_first_prompts_never_fit(tokenizer):
    from telescope_rollout.engine import unfit_environment

    long, mixed, short = LongEnv(n=5), EveryThirdLong(), EchoEnv()
    for env in (long, mixed, short):
        env.load_dataset()
    lengths = [prompt_len(tokenizer, long, i) for i in range(5)]
    kwargs: dict[str, Any] = {"max_model_len": 256, "max_tokens": 16}
    msg = unfit_environment({"echo": short, "mixed": mixed, "long": long}, tokenizer, **kwargs)
    assert msg is not None
    assert msg.startswith("environment 'long' has no prompt that fits the context: none of its first 5")
    assert "(they are all 5 of its training prompts)" in msg
    assert f"The longest has {max(lengths)} prompt tokens, the shortest {min(lengths)};" in msg
    assert unfit_environment({"echo": short, "mixed": mixed}, tokenizer, **kwargs) is None  # some fit
    # a large dataset whose first `probe` prompts are all too long
    big = LongEnv(n=100)
    big.load_dataset()
    msg = unfit_environment({"big": big}, tokenizer, probe=8, **kwargs)
    assert msg is not None
    assert "none of its first 8 prompts" in msg
