"""The engine's timeline events (``RolloutEngine(on_event=...)``), driven with the in-process fake
server: pause and resume at the async limit, batches assembled, drains and restores, cancelled
groups, weight updates; a callback that raises is survived."""

from __future__ import annotations

from engine_fakes import EchoEnv, by_sample_parity, make_engine
from structlog.testing import capture_logs

from telescope_rollout import EngineSettings, MultiEnvSampler, RolloutEngine, SamplerEntry
from telescope_rollout.engine import EngineEvent
from telescope_rollout.testing import FakeInferenceServer, group_advantages, sample_ids, settle

URL = "http://fake-0"


def _kinds(events: list[EngineEvent]) -> list[str]:
    return [e.kind for e in events]


async def test_pause_resume_and_batches_are_events(tokenizer):
    events: list[EngineEvent] = []
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: sample_ids([r])[0] < 4)
    engine = make_engine(tokenizer, server, max_async_rollout=0)
    engine.on_event = events.append
    async with engine:
        await settle()
        server.release(lambda r: sample_ids([r])[0] < 2)
        await engine.next_batch(timeout_s=10)
        await settle()
        server.release()  # group 1 was cancelled when batch 0 made it too stale to keep
        await settle()
        engine.weights_updated(1)
        await engine.next_batch(timeout_s=10)
    assert _kinds(events)[:6] == [
        "batch_assembled",
        "group_cancelled",
        "dispatch_paused",
        "weights_updated",
        "dispatch_resumed",
        "batch_assembled",
    ]
    b0, cancelled, paused, update, resumed, b1 = events[:6]
    assert (b0.step, b0.detail) == (0, {"kept": 1, "discarded": 0, "cancelled": 0})
    assert (cancelled.step, cancelled.detail["reason"], cancelled.detail["group_id"]) == (1, "max_async", 1)
    assert (paused.step, paused.detail) == (1, {"version": 0, "max_async_rollout": 0})
    assert (update.step, update.detail) == (1, {"version": 1, "servers": [URL]})
    assert (resumed.step, resumed.detail["version"]) == (1, 1)
    assert resumed.detail["paused_s"] >= 0.0
    assert (b1.step, b1.detail) == (1, {"kept": 1, "discarded": 0, "cancelled": 1})
    times = [e.time for e in events]
    assert times == sorted(times)
    assert times[0] > 1e9  # wall clock


async def test_drain_restore_and_cancellations_are_events(tokenizer):
    events: list[EngineEvent] = []
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server)
    engine.on_event = events.append
    async with engine:
        await settle()  # groups 0 and 1 hold every lane
        assert await engine.drain_servers([URL]) == 2
        engine.restore_servers([URL])
    assert _kinds(events) == ["servers_drained", "group_cancelled", "group_cancelled", "servers_restored"]
    drained, c0, c1, restored = events
    assert drained.detail == {"servers": [URL], "reason": "eval_drain", "cancelled_groups": 2}
    assert [c0.detail, c1.detail] == [
        {"reason": "eval_drain", "group_id": 0, "server": URL},
        {"reason": "eval_drain", "group_id": 1, "server": URL},
    ]
    assert restored.detail == {"servers": [URL], "version": 0}
    assert all(e.step == 0 for e in events)


async def test_off_policy_cancellation_is_an_event(tokenizer):
    events: list[EngineEvent] = []
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: r.request_id == "sample-0")
    engine = make_engine(tokenizer, server, max_off_policy_steps=0)
    engine.on_event = events.append
    async with engine:
        await engine.next_batch(timeout_s=10)
        engine.weights_updated(1)
    cancels = [e for e in events if e.kind == "group_cancelled"]
    assert [c.detail for c in cancels] == [{"reason": "off_policy", "group_id": 0, "server": URL}]
    update = next(i for i, e in enumerate(events) if e.kind == "weights_updated")
    assert events.index(cancels[0]) > update  # the update comes first, then what it cancelled


async def test_a_raising_callback_is_logged_once_and_the_engine_goes_on(tokenizer):
    calls: list[str] = []

    def broken(event: EngineEvent) -> None:
        calls.append(event.kind)
        raise RuntimeError("timeline writer is down")

    env = EchoEnv()
    env.load_dataset()
    settings = EngineSettings(
        group_size=2, prompts_batch_size_for_trainer=1, max_async_rollout=10, max_tokens=16,
        max_model_len=256, enable_prompt_prefetch=False, enable_thinking=None,
    )  # fmt: skip
    engine = RolloutEngine(
        settings, environments={"echo": env}, sampler=MultiEnvSampler([SamplerEntry("echo", 1.0, len(env))]),
        tokenizer=tokenizer, client=FakeInferenceServer(reply=by_sample_parity),
        advantage_fn=group_advantages, on_event=broken,
    )  # fmt: skip
    with capture_logs() as logs:
        async with engine:
            batches = [await engine.next_batch(timeout_s=10) for _ in range(3)]
            engine.weights_updated(1)
            batches.append(await engine.next_batch(timeout_s=10))
    assert [b.step for b in batches] == [0, 1, 2, 3]
    assert calls.count("batch_assembled") >= 4
    assert "weights_updated" in calls
    warnings = [e for e in logs if e["event"] == "rollout_on_event_failed"]
    assert len(warnings) == 1
    assert "timeline writer is down" in warnings[0]["error"]


async def test_no_callback_no_events(tokenizer):
    engine = make_engine(tokenizer, FakeInferenceServer(reply=by_sample_parity))
    assert engine.on_event is None
    async with engine:
        await engine.next_batch(timeout_s=10)  # nothing to call, nothing breaks
