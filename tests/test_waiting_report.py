"""A step waiting for its batch reports at each interval (console, log, record) and writes what was
dropped for it so far, also when the engine gives up; driven by a stand-in engine (the real one is
in tests/test_e2e_matrix.py's zero-advantage runs)."""

from __future__ import annotations

import asyncio
import io
import json
import re
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
import structlog

from telescope_cli.console import Console
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.run.waiting import next_batch, on_engine_event
from telescope_orchestrator.run.waiting import report as waiting_report
from telescope_rollout import DroppedGroup, RolloutBatch, RolloutError, ScoredGroup, ScoredSample
from telescope_rollout.engine import BatchProgress, RewardTally


class Engine:
    """Hands out ``batch`` once ``release`` is set (or raises ``error``); two groups dropped so far."""

    def __init__(self, group) -> None:
        self.release = asyncio.Event()
        self.error: Exception | None = None
        self.batch = RolloutBatch(0, [])
        self.dropped = [DroppedGroup(group, "zero_advantage", step=0, version=0)]

    async def next_batch(self):
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.batch

    def progress(self) -> BatchProgress:
        tally = RewardTally()
        tally.add(0.0)
        return BatchProgress(step=0, kept=0, needed=2, dropped={"zero_advantage": 2}, cancelled={},
                             in_flight=3, rewards={"count": tally})  # fmt: skip

    def pending_drops(self):
        return list(self.dropped), []


def _group() -> ScoredGroup:
    sample = ScoredSample(
        env_name="count", group_id=4, sample_id=8, sample_index=2, reward=0.0, advantage=0.0, prompt_text="p",
        completion_text="c", prompt_ids=[1], completion_ids=[2], completion_mask=[1], finish_reason="stop",
        dispatched_at=100.0, finished_at=101.0,
    )  # fmt: skip
    return ScoredGroup(4, "count", [sample], sample_index=2)


def _ctx(tmp_path, engine):
    out = io.StringIO()
    config = SimpleNamespace(event_upload_interval_seconds=0.05)
    ctx = SimpleNamespace(engine=engine, rollout=engine, config=config, console=Console(2, file=out),
                          run=RunDir(tmp_path / "r"))  # fmt: skip
    return ctx, out


async def test_a_long_wait_is_reported_and_its_drops_recorded_until_the_batch_comes(tmp_path):
    engine = Engine(_group())
    ctx, out = _ctx(tmp_path, engine)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(next_batch(ctx, 1))
        await asyncio.sleep(1.0)
        engine.release.set()
        assert await asyncio.wait_for(task, 5) is engine.batch
    reports = [e for e in logs if e["event"] == "waiting for a batch"]
    assert len(reports) >= 2
    assert reports[0]["kept"] == 0
    assert reports[0]["dropped"] == {"zero_advantage": 2}
    assert reports[0]["rewards"]["count"]["max"] == 0.0
    first = out.getvalue().splitlines()[0]
    assert re.fullmatch(
        r"step 1/2  waiting \d+ s: kept 0/2 groups, dropped 2 \(zero_advantage 2\), 3 in flight; "
        r"the finished group scored 0\.0",
        first,
    ), first
    samples = pq.read_table(
        ctx.run.path / "records" / "samples" / "step_000001-dropped-a000-1.parquet"
    ).to_pylist()
    assert [(r["status"], r["reason"], r["finished_at"]) for r in samples] == [
        ("discarded", "zero_advantage", 101.0)
    ]
    events = pq.read_table(ctx.run.path / "records" / "orchestrator_events").to_pylist()
    waits = [e for e in events if e["event"] == "batch_waiting"]
    assert waits
    assert json.loads(waits[0]["detail"])["needed"] == 2


async def test_a_batch_that_comes_at_once_reports_nothing(tmp_path):
    engine = Engine(_group())
    engine.release.set()
    ctx, out = _ctx(tmp_path, engine)
    assert await next_batch(ctx, 1) is engine.batch
    assert out.getvalue() == ""
    assert not (ctx.run.path / "records" / "samples").exists()


async def test_when_the_engine_gives_up_the_drops_are_written_before_the_error_goes_on(tmp_path):
    engine = Engine(_group())
    engine.error = RolloutError("no group was kept in the last 20 groups")
    engine.release.set()
    ctx, _ = _ctx(tmp_path, engine)
    with pytest.raises(RolloutError, match="no group was kept"):
        await next_batch(ctx, 1)
    samples = pq.read_table(ctx.run.path / "records" / "samples").to_pylist()
    assert [r["sample_id"] for r in samples] == [8]


def test_an_environment_that_trains_nothing_is_recorded_and_warned_on_the_console(tmp_path):
    out = io.StringIO()
    run, console = RunDir(tmp_path / "r"), Console(2, file=out)
    on_event = on_engine_event(run.records, console)
    message = "environment 'count[x]' trains nothing: its last 8 groups were all dropped for zero advantage"
    on_event(
        SimpleNamespace(
            kind="environment_flat", step=0, time=5.0, detail={"env": "count[x]", "message": message}
        )
    )
    on_event(SimpleNamespace(kind="batch_assembled", step=0, time=6.0, detail={"kept": 2}))
    assert out.getvalue() == f"warning: {message}\n"  # printed as is (no markup), the other event not at all
    assert [(e["event"], e["step"]) for e in run.records.events] == [
        ("environment_flat", 1),
        ("batch_assembled", 1),
    ]


async def test_full_reports_come_after_two_intervals_then_every_six(tmp_path, monkeypatch):
    from telescope_orchestrator.run import waiting

    engine = Engine(_group())
    ctx, _ = _ctx(tmp_path, engine)
    clock = iter([0.05 * k for k in range(1000)])  # the k-th reading: k intervals after the start
    seen: list[bool] = []
    monkeypatch.setattr(waiting, "report", lambda ctx, step, waited, *, full, filling: seen.append(full))
    task = asyncio.ensure_future(next_batch(ctx, 1, clock=lambda: next(clock)))
    while len(seen) < 15:
        await asyncio.sleep(0.01)
    engine.release.set()
    await asyncio.wait_for(task, 5)
    assert [i + 1 for i, f in enumerate(seen[:15]) if f] == [2, 8, 14]


async def test_a_report_after_the_batch_was_handed_over_says_nothing(tmp_path):
    engine = Engine(_group())
    ctx, out = _ctx(tmp_path, engine)
    waiting_report(ctx, 1, 10.0, full=True, filling=5)  # the engine fills batch 0: 5 is gone
    assert out.getvalue() == ""
    assert not ctx.run.records.events


async def test_a_report_that_fails_is_logged_and_the_run_goes_on(tmp_path):
    engine: Any = Engine(_group())
    engine.progress = lambda: 1 / 0
    ctx, _ = _ctx(tmp_path, engine)
    with structlog.testing.capture_logs() as logs:
        waiting_report(ctx, 1, 10.0, full=True, filling=0)
    assert [e["event"] for e in logs] == ["the waiting step's report failed"]
