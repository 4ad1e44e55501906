"""Scheduling logic of the rollout engine, driven deterministically with an in-process fake server."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import typing
from typing import Any

import pytest
from engine_fakes import EchoEnv, GatedRewardEnv, by_sample_parity, make_engine

from telescope_rollout import (
    EngineSettings,
    MultiEnvSampler,
    MultiTurnEnvironment,
    RolloutError,
    Sample,
    SamplerEntry,
)
from telescope_rollout.engine import progress_line
from telescope_rollout.inference import cache_salt
from telescope_rollout.testing import FakeClock, FakeInferenceServer, sample_ids, settle


async def test_full_batch_fields_and_advantages(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    clock = FakeClock(100.0)
    engine = make_engine(tokenizer, server, clock=clock, group_size=4, prompts_batch_size_for_trainer=2)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    assert batch.step == 0
    assert len(batch.groups) == 2
    # rewards [0, 1, 0, 1]: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735, eps 1e-4
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    env = engine.environments["echo"]
    assert isinstance(env, EchoEnv)
    for g in batch.groups:
        assert [s.reward for s in g.samples] == [0.0, 1.0, 0.0, 1.0]
        assert [s.advantage for s in g.samples] == pytest.approx([-expected, expected, -expected, expected])
        prompt = env.format_prompt(env.get_sample(g.sample_index).prompt, tokenizer)
        assert g.prompt_text == prompt
        for s in g.samples:
            assert s.prompt_ids == tokenizer.encode(prompt)
            assert s.completion_ids == [10 + s.sample_id % 2, 3]
            assert s.completion_mask == [1, 1]
            assert s.completion_logprobs == [-0.5, -0.5]
            assert s.finish_reason == "stop"
            assert (s.version_start, s.version_end, s.off_policy_steps, s.error) == (0, 0, 0, None)
            assert s.metrics == {"len": 1.0}
            assert s.server == "http://fake-0"
    # one prompt per group, sample ids 0..7 in order, max_tokens min(16, 256 - prompt length)
    assert sorted(s.sample_id for s in batch.samples) == list(range(8))
    for r in server.requests[:8]:
        assert r.max_tokens == 16
        assert r.sampling == {"temperature": 1.0}
    assert batch.metrics["rollout/groups_kept"] == 2.0
    assert batch.metrics["rollout/samples"] == 8.0
    assert batch.metrics["rollout/completion_tokens"] == 16.0
    assert batch.metrics["rollout/batch_time_s"] == 0.0  # the fake clock never moved


async def test_lanes_smallest_first_and_freed_after_generation(tokenizer):
    gate = asyncio.Event()

    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, env=GatedRewardEnv(gate))
    pool = engine.pool.lanes["http://fake-0"]
    async with engine:
        await settle()
        # 2 prompts x group 2 = 4 slots, all busy; nothing else asked
        assert len(server.pending) == 4
        assert pool.busy == 4
        assert engine.in_flight_groups == 2
        # generation of all 4 ends; rewards block: lanes are free anyway and 4 new requests start
        server.release()
        await settle()
        assert len(server.pending) == 4
        assert sample_ids(server.pending) == [4, 5, 6, 7]
        assert engine.in_flight_groups == 4
        gate.set()
        batch = await engine.next_batch(timeout_s=10)
        assert batch.groups[0].group_id == 0
        assert sorted(s.lane for s in batch.groups[0].samples) == [0, 1]


async def test_dispatch_waits_while_more_samples_wait_for_rewards_than_there_are_lanes(tokenizer):
    """A grader (or a teacher server) that never answers: 4 lane slots, so 4 samples may wait for
    their rewards beyond what the slots hold; then no group starts until a reward comes back."""
    gate = asyncio.Event()

    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, env=GatedRewardEnv(gate))
    async with engine:
        await settle()
        for _ in range(2):  # 4 samples generate, then 4 more: 8 wait for rewards, more than 4 slots
            server.release()
            await settle()
        assert engine.grading == 8
        assert server.pending == []  # nothing else was asked
        assert len(server.requests) == 8
        for _ in range(3):
            await settle()
        assert len(server.requests) == 8
        assert engine.in_flight_groups == 4
        held = engine.progress()  # the waiting line says why nothing starts
        assert (held.grading, held.grading_held) == (8, True)
        assert "new groups held back: 8 samples wait for their rewards or scores" in progress_line(held)
        gate.set()  # the rewards come back: dispatch goes on, and a batch is made
        batch = await engine.next_batch(timeout_s=10)
        await settle()
        assert len(server.requests) > 8
        assert batch.groups[0].group_id == 0


async def test_lane_held_through_reward_without_free_after_generation(tokenizer):
    gate = asyncio.Event()

    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, env=GatedRewardEnv(gate), free_lane_after_generation=False)
    async with engine:
        await settle()
        server.release()
        await settle()
        assert server.pending == []
        assert len(server.requests) == 4  # no slot came free while the rewards run
        gate.set()
        await engine.next_batch(timeout_s=10)
        await settle()
        assert len(server.requests) > 4


async def test_individual_lane_queues_samples_on_their_server(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, group_size=3, max_concurrent_prompts_per_server=1)
    pool = engine.pool.lanes["http://fake-0"]
    async with engine:
        await settle()
        assert sample_ids(server.pending) == [0, 1, 2]
        server.release(n=1)  # one slot frees: a new group starts, one sample runs, two wait
        await settle()
        assert sample_ids(server.pending) == [1, 2, 3]
        assert pool.waiting == 2
        assert pool.unclaimed == -2
        assert engine.in_flight_groups == 2
        server.release(lambda r: True)
        await settle()
        assert sample_ids(server.pending)[:2] == [4, 5]


async def test_group_mode_returns_slots_when_the_whole_group_ends(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(
        tokenizer, server, enable_individual_sample_lanes=False, free_lane_after_generation=False
    )
    async with engine:
        await settle()
        assert sample_ids(server.pending) == [0, 1, 2, 3]
        server.release(lambda r: sample_ids([r])[0] == 0)
        await settle()
        assert sample_ids(server.pending) == [1, 2, 3]  # group 0 still holds both slots
        server.release(lambda r: sample_ids([r])[0] == 1)
        await settle()
        assert sample_ids(server.pending) == [2, 3, 4, 5]
        batch = await engine.next_batch(timeout_s=10)
        assert sorted(s.lane for s in batch.groups[0].samples) == [0, 1]


async def test_pause_at_async_limit_and_resume_on_weights(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: sample_ids([r])[0] < 4)
    engine = make_engine(tokenizer, server, max_async_rollout=0)
    async with engine:
        await settle()
        assert sample_ids(server.pending) == [0, 1, 2, 3]  # groups 0 and 1, both under version 0
        assert not engine.idle
        server.release(lambda r: sample_ids([r])[0] < 2)
        b0 = await engine.next_batch(timeout_s=10)
        await settle()
        assert engine.paused
        assert engine.async_level == 1
        # group 1 started under version 0 and can land in step 1 at the earliest: it could never be
        # kept, so batch 0 cancelled it instead of letting it finish
        assert not engine.in_flight_groups
        assert engine.idle  # nothing generates before the next update: the servers' cores are free
        server.release()
        await settle()
        assert len(server.requests) == 4  # nothing new while step - version > max_async_rollout
        engine.weights_updated(1)
        assert not engine.idle
        b1 = await engine.next_batch(timeout_s=10)
    assert (b0.step, b1.step) == (0, 1)
    assert [g.group_id for g in b0.groups] == [0]
    assert [(d.group.group_id, d.reason) for d in b1.cancelled] == [(1, "max_async")]
    assert not b1.discarded
    assert all(s.version_start == 1 for s in b1.samples)
    assert b1.metrics["rollout/pauses"] == 1.0
    assert b1.metrics["rollout/cancelled_max_async"] == 1.0
    assert b1.metrics["rollout/async_level"] == 0.0


async def test_requests_carry_the_cache_salt_of_the_weights_their_server_holds(tokenizer):
    """vLLM shares cached prompt blocks only between requests with one salt: once the engine knows
    version 1 is live, its requests name it, so none reuses a prefix computed under version 0."""
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, max_async_rollout=0)
    async with engine:
        await engine.next_batch(timeout_s=10)
        await settle()
        assert engine.paused  # nothing more is sent under version 0
        sent_under_0 = len(server.requests)
        engine.weights_updated(1)
        await engine.next_batch(timeout_s=10)
    assert sent_under_0 >= 2
    assert {r.cache_salt for r in server.requests[:sent_under_0]} == {"telescope-w0"}
    assert len(server.requests) > sent_under_0
    assert {r.cache_salt for r in server.requests[sent_under_0:]} == {"telescope-w1"}
    assert cache_salt(1) == "telescope-w1" != cache_salt(0)


async def test_staleness_is_measured_from_dispatch_and_an_unkeepable_group_is_cancelled(tokenizer):
    # sample 0 (group 0) starts under version 0 and is held; other groups build batches 0 and 1
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: r.request_id == "sample-0")
    engine = make_engine(tokenizer, server, max_async_rollout=1, max_off_policy_steps=-1)
    async with engine:
        b0 = await engine.next_batch(timeout_s=10)
        b1 = await engine.next_batch(timeout_s=10)
        # step 2 - version 0 = 2 > 1: it would land 2 steps stale whenever it finished (even after
        # an update: staleness counts from the version a sample started under), so it is cancelled
        assert 0 not in engine._groups
        await settle()
        assert engine.paused  # step 2 - version 0 > 1
        engine.weights_updated(1)  # now step 2 - version 1 = 1: resumes
        server.release()
        b2 = await engine.next_batch(timeout_s=10)
    assert 0 not in {g.group_id for g in [*b0.groups, *b1.groups, *b2.groups]}
    assert not [d for d in [*b1.discarded, *b2.discarded] if d.group.group_id == 0]
    (cancelled,) = [d for d in b2.cancelled if d.group.group_id == 0]
    assert (cancelled.reason, cancelled.step, cancelled.version) == ("max_async", 2, 0)
    assert cancelled.group.samples[0].version_start == 0
    assert cancelled.group.samples[0].error == "cancelled"


async def test_cancel_after_max_off_policy_steps(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: r.request_id == "sample-0")
    engine = make_engine(tokenizer, server, max_off_policy_steps=1)
    async with engine:
        await engine.next_batch(timeout_s=10)
        engine.weights_updated(1)
        assert engine.cancelled_groups == 0
        engine.weights_updated(2)
        assert engine.cancelled_groups == 1
        await settle()
        held = next(r for r in server.requests if r.request_id == "sample-0")
        assert held.future is not None
        assert held.future.cancelled()
        cancelled = []
        for _ in range(5):
            batch = await engine.next_batch(timeout_s=10)
            cancelled += batch.cancelled
            if cancelled:
                break
    assert [c.group.group_id for c in cancelled] == [0]
    assert cancelled[0].reason == "off_policy"
    s0, s1 = cancelled[0].group.samples
    assert (s0.error, s0.off_policy_steps) == ("cancelled", 2)
    assert (s1.error, s1.off_policy_steps) == (None, 0)  # its sibling had finished generating
    assert engine.pool.lanes["http://fake-0"].busy <= engine.settings.lanes_per_server


async def test_zero_advantage_groups_discarded(tokenizer):
    server = FakeInferenceServer()
    engine = make_engine(tokenizer, server, prompts_batch_size_for_trainer=3)
    echo = engine.environments["echo"]
    assert isinstance(echo, EchoEnv)
    index_of = {tuple(tokenizer.encode(echo.format_prompt(f"q{i}", tokenizer))): i for i in range(8)}

    def reply_by_prompt(req):  # constant reward for even prompts, spread for odd ones
        i = index_of[tuple(req.prompt)]
        sid = sample_ids([req])[0]
        return (str(sid % 2) if i % 2 else "1"), [5]

    server.reply = reply_by_prompt
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    assert all(g.sample_index % 2 == 1 for g in batch.groups)
    assert batch.discarded
    for d in batch.discarded:
        assert d.reason == "zero_advantage"
        assert d.group.sample_index % 2 == 0
        assert [s.advantage for s in d.group.samples] == [0.0, 0.0]


async def test_zero_advantage_groups_kept_when_filter_off(tokenizer):
    server = FakeInferenceServer(reply=lambda r: ("1", [5]))
    engine = make_engine(tokenizer, server, discard_group_zero_advantage=False)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    assert batch.discarded == []
    assert [s.advantage for s in batch.samples] == [0.0, 0.0]


async def test_error_groups_dropped_with_reason(tokenizer):
    env = EchoEnv(n=3, long_index=0, fail_index=1)
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, env=env, prompts_batch_size_for_trainer=3)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    assert {g.sample_index for g in batch.groups} == {2}
    reasons = {d.group.sample_index: d.reason for d in batch.discarded}
    assert reasons == {0: "prompt_too_long", 1: "sample_error"}
    long_prompt = next(d for d in batch.discarded if d.reason == "prompt_too_long")
    assert "max_model_len 256" in long_prompt.group.samples[0].error_detail
    # the too-long prompt never reached the server
    n_long = len(tokenizer.encode(env.format_prompt(env.get_sample(0).prompt, tokenizer)))
    assert n_long > 256
    assert all(len(r.prompt) < 256 for r in server.requests)


async def test_max_tokens_shortened_to_fit_context(tokenizer):
    env = EchoEnv(n=1)
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, env=env, max_tokens=100, max_model_len=30)
    async with engine:
        await engine.next_batch(timeout_s=10)
    n = len(tokenizer.encode(env.format_prompt("q0", tokenizer)))
    assert 0 < 30 - n < 100
    assert {r.max_tokens for r in server.requests} == {30 - n}


async def test_unreachable_servers_fail_clearly(tokenizer):
    server = FakeInferenceServer(server_urls=["http://a", "http://b"], dead={"http://a", "http://b"})
    engine = make_engine(tokenizer, server)
    async with engine:
        with pytest.raises(RolloutError, match="every inference server is unreachable: http://a"):
            await engine.next_batch(timeout_s=10)


async def test_dead_server_is_skipped_until_marked_up(tokenizer):
    server = FakeInferenceServer(
        server_urls=["http://a", "http://b"], reply=by_sample_parity, dead={"http://a"}
    )
    engine = make_engine(tokenizer, server, prompts_batch_size_for_trainer=3)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
        assert {g.server for g in batch.groups} == {"http://b"}
        assert {d.reason for d in batch.discarded} == {"rollout_error"}
        assert engine.pool.down.keys() == {"http://a"}
        server.dead.clear()
        engine.mark_server_up("http://a")
        servers = set()
        for _ in range(3):
            servers |= {g.server for g in (await engine.next_batch(timeout_s=10)).groups}
    assert servers == {"http://a", "http://b"}


async def test_a_timed_out_request_fails_its_sample_but_keeps_the_server(tokenizer):
    # a generation can be slow without the server being gone: training keeps sending to it
    server = FakeInferenceServer(
        server_urls=["http://a", "http://b"], reply=by_sample_parity, hung={"http://a"}
    )
    engine = make_engine(tokenizer, server, prompts_batch_size_for_trainer=3)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
        assert {d.reason for d in batch.discarded} == {"rollout_error"}
        assert {s.error_detail for d in batch.discarded for s in d.group.samples} == {
            "ServerTimeoutError: http://a: no answer within 1200 s (fake)"
        }
        assert engine.pool.down == {}
        server.hung.clear()
        servers = set()
        for _ in range(3):
            servers |= {g.server for g in (await engine.next_batch(timeout_s=10)).groups}
    assert servers == {"http://a", "http://b"}


class _PreparedEnv(EchoEnv):
    def __init__(self, *a, fail: bool = False, **kw):
        super().__init__(*a, **kw)
        self.prepared, self.fail = 0, fail

    async def prepare_resources(self) -> None:
        self.prepared += 1
        if self.fail:
            raise OSError("sandbox pool could not start")


async def test_eager_prepare_resources_runs_before_the_first_request(tokenizer):
    env = _PreparedEnv()
    server = FakeInferenceServer(reply=by_sample_parity)
    eager = make_engine(tokenizer, server, env=env, eager_prepare_resources=True)
    async with eager:
        assert env.prepared == 1  # awaited before dispatch starts
        await eager.next_batch(timeout_s=10)
    lazy_env = _PreparedEnv()
    async with make_engine(tokenizer, FakeInferenceServer(reply=by_sample_parity), env=lazy_env) as lazy:
        await lazy.next_batch(timeout_s=10)
    assert lazy_env.prepared == 0  # default: the environment prepares itself when it needs to
    failing = make_engine(tokenizer, server, env=_PreparedEnv(fail=True), eager_prepare_resources=True)
    with pytest.raises(RolloutError, match="echo: OSError: sandbox pool could not start"):
        async with failing:
            pass


async def test_state_dict_resumes_the_prompt_sequence(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, enable_prompt_prefetch=True, prompt_prefetch_buffer_size=5)
    async with engine:
        await settle()
        state = engine.state_dict()
    assert engine.next_group_id == 2
    assert state["sampler"]["draws"] == 2  # prefetched prompts are not consumed
    assert state["next_sample_id"] == 4
    reference = MultiEnvSampler([SamplerEntry("echo", 1.0, 8)], seed=0)
    expected = [reference.draw().index for _ in range(3)][2]
    resumed = make_engine(tokenizer, FakeInferenceServer(reply=by_sample_parity))
    resumed.load_state_dict(state)
    async with resumed:
        batch = await resumed.next_batch(timeout_s=10)
    assert batch.groups[0].group_id == 2
    assert batch.groups[0].sample_index == expected
    assert batch.groups[0].samples[0].sample_id == 4


class CountingGame(MultiTurnEnvironment):
    """The env answers "again" until three model turns; reward = number of model tokens."""

    max_turns = 3

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("start")], num_samples)

    def env_response(self, messages, state):
        return [{"role": "user", "content": "again"}]

    def compute_reward(self, state, eos_token=""):
        return (
            float(len(state.get_full_completion_ids())) + state.num_turns * (state.sample.metadata["_index"])
        )


async def test_multi_turn_interleaves_tokens_and_prioritises_later_turns(tokenizer):
    server = FakeInferenceServer(reply=lambda r: ("hi", [7, 8]))
    env = CountingGame()
    engine = make_engine(tokenizer, server, env=env, discard_group_zero_advantage=False)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    s = batch.groups[0].samples[0]
    assert s.num_turns == 3
    assert s.finish_reason == "max_turns_reached"
    reqs = [r for r in server.requests if r.request_id.startswith(f"sample-{s.sample_id}-")]
    assert [r.priority for r in reqs] == [0, -1, -2]
    # turn k+1's prompt = turn k's prompt + model ids + closing suffix + env ids
    tt = engine.prompts.turn_tokenizer
    env_ids = tt.env_ids([{"role": "user", "content": "again"}])
    closing = tt.suffix_after([7, 8])
    assert reqs[1].prompt == [*reqs[0].prompt, 7, 8, *closing, *env_ids]
    assert reqs[2].prompt == [*reqs[1].prompt, 7, 8, *closing, *env_ids]
    turn_ctx = [0] * (len(closing) + len(env_ids))
    assert s.completion_mask == [1, 1, *turn_ctx, 1, 1, *turn_ctx, 1, 1]
    assert s.completion_ids == [*reqs[2].prompt[len(reqs[0].prompt) :], 7, 8]
    assert s.prompt_ids == reqs[0].prompt
    assert s.completion_logprobs.count(-0.5) == 6
    assert s.reward == 6.0


async def test_next_batch_needs_a_started_engine(tokenizer):
    engine = make_engine(tokenizer, FakeInferenceServer())
    with pytest.raises(RuntimeError, match="start the engine first"):
        await engine.next_batch(timeout_s=1)


def test_settings_from_config_reads_the_config_names():
    from telescope_config import TelescopeConfig, defaults

    cfg = TelescopeConfig.model_validate({**defaults(), "environments": [{"name": "countdown"}]})
    s = EngineSettings.from_config(cfg, group_size=4)
    assert s.group_size == 4
    assert s.prompts_batch_size_for_trainer == cfg.prompts_batch_size_for_trainer
    assert s.max_async_rollout == cfg.max_async_rollout
    assert s.scheduling_policy == cfg.vllm_scheduling_policy
    assert s.lanes_per_server == cfg.max_concurrent_prompts_per_server * 4
    assert s.max_consecutive_unfit_prompts == cfg.max_consecutive_unfit_prompts == 32
    fewer = TelescopeConfig.model_validate(
        {**defaults(), "environments": [{"name": "countdown"}], "max_consecutive_unfit_prompts": 5}
    )
    assert EngineSettings.from_config(fewer).max_consecutive_unfit_prompts == 5
    with pytest.raises(ValueError, match="free_lane_after_generation needs enable_individual_sample_lanes"):
        EngineSettings(enable_individual_sample_lanes=False, free_lane_after_generation=True)


def test_every_engine_setting_is_a_config_field_with_the_packaged_default():
    from telescope_rollout.engine import config_mismatches

    assert config_mismatches(EngineSettings) == []


def test_from_config_names_a_missing_field():
    from telescope_config import TelescopeConfig, defaults

    cfg = TelescopeConfig.model_validate({**defaults(), "environments": [{"name": "countdown"}]})

    class WithoutPolicy:
        def __getattr__(self, name: str) -> Any:
            if name == "vllm_scheduling_policy":
                raise AttributeError(name)
            return getattr(cfg, name)

    without_policy: Any = WithoutPolicy()  # a config that lacks one field
    with pytest.raises(
        AttributeError, match=r"no field 'vllm_scheduling_policy' \(for EngineSettings\.scheduling_policy\)"
    ):
        EngineSettings.from_config(without_policy)
    assert EngineSettings.from_config(without_policy, scheduling_policy="fcfs").scheduling_policy == "fcfs"


@dataclasses.dataclass(frozen=True)
class Drifted:
    """Settings that disagree with the config in every way config_mismatches reports."""

    CONFIG_NAMES: typing.ClassVar[dict[str, str]] = {"policy": "vllm_scheduling_policy"}
    NOT_IN_CONFIG: typing.ClassVar[frozenset[str]] = frozenset({"group_size"})
    OWN_DEFAULTS: typing.ClassVar[dict[str, str]] = {"max_tokens": "on purpose"}
    group_size: int = 8  # a config field listed as not in the config
    renamed_awy: int = 1  # no such config field
    policy: str = "fcfs"  # the packaged default is "priority"
    max_tokens: int = 3700  # claimed to differ, but equals the packaged default
    seed: int = 0


def test_config_mismatches_names_each_disagreement():
    from telescope_rollout.engine import config_mismatches

    found = config_mismatches(Drifted)
    assert found == [
        "group_size is a config field: from_config must read it",
        "Drifted.renamed_awy maps to no config field",
        "Drifted.policy: 'fcfs' != 'priority'",
        "Drifted.max_tokens no longer differs from the config: drop it from OWN_DEFAULTS",
    ]


async def test_cancelling_next_batch_as_its_batch_arrives_cancels_and_keeps_the_batch(tokenizer):
    # Ctrl-C cancels the training loop while it waits for a batch; when the batch lands in the
    # same turn of the event loop, the wait must still end cancelled (Python 3.11's wait_for
    # returned the batch instead, and the run trained on) and the batch must stay queued.
    server = FakeInferenceServer(hold=lambda r: True)
    engine = make_engine(tokenizer, server)
    async with engine:
        waiter = asyncio.create_task(engine.next_batch(timeout_s=60))
        await settle()
        marker: Any = object()  # stands in for a RolloutBatch
        engine._batches.put_nowait(marker)  # the batch arrives ...
        waiter.cancel()  # ... and Ctrl-C, before the waiter runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await engine.next_batch(timeout_s=1) is marker
