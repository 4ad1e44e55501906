"""A step waiting for its batch says so: the console line, the log line, the record's event and the
groups dropped for it so far, every ``event_upload_interval_seconds`` while it waits.

A batch that takes longer than one interval (a run whose groups are all dropped, slow rewards, a
server being restarted) is reported at each interval, from the engine's own counts
(``RolloutEngine.progress()``)::

    step 3/15  waiting 25 s: kept 0/2 groups, dropped 14 (zero_advantage 14), 4 in flight; every
    finished group scored 0.0

The same counts go to ``logs/telescope.jsonl`` ("waiting for a batch") and, as a ``batch_waiting``
orchestrator event, to the record together with the groups dropped so far (docs/records.md,
"Files": ``step_N-dropped-K``), so the inspector shows a stalled step while it is stalled. When the
engine gives up (``RolloutError``), what it dropped for the step is written before the error goes
on.

The engine's events go to the record (``on_engine_event``); one that warns, an environment whose
groups are all dropped for zero advantage while the others train (``environment_flat``), also goes
to the console.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["next_batch", "on_engine_event"]

log = structlog.get_logger()


async def next_batch(ctx: Any, step: int) -> Any:
    """``ctx.engine.next_batch()``, reporting every ``event_upload_interval_seconds`` it waits."""
    from telescope_rollout import RolloutError

    interval = float(ctx.config.event_upload_interval_seconds)
    t0 = time.monotonic()
    task = asyncio.ensure_future(ctx.engine.next_batch())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            report(ctx, step, time.monotonic() - t0, interval)
    except RolloutError:
        _write_drops(ctx, step)
        raise
    finally:
        if not task.done():
            task.cancel()


def report(ctx: Any, step: int, waited_s: float, interval_s: float) -> None:
    """One report of the wait (module docstring): console, log, record."""
    from telescope_rollout.engine import progress_line

    p = ctx.engine.progress()
    line = progress_line(p)
    ctx.console.waiting(step, waited_s, line, interval_s=interval_s)
    counts = {"kept": p.kept, "needed": p.needed, "dropped": p.dropped, "cancelled": p.cancelled}
    rewards = {
        e: {"groups": t.groups, "min": t.low, "max": t.high, "mean": t.mean} for e, t in p.rewards.items()
    }
    detail = {**counts, "in_flight": p.in_flight, "rewards": rewards}
    log.info("waiting for a batch", step=step, waited_s=round(waited_s, 1), **detail)
    ctx.run.records.event("batch_waiting", step, waited_s=waited_s, **detail)
    _write_drops(ctx, step)


def _write_drops(ctx: Any, step: int) -> None:
    """The groups dropped for ``step`` so far, and the events since the last write, into the record
    (never raises: a record must never stop a run)."""
    try:
        ctx.run.records.write_waiting(step, *ctx.engine.pending_drops())
    except Exception as exc:
        log.warning("the waiting step's records not written", step=step, error=repr(exc))


def on_engine_event(records: Any, console: Any) -> Callable[[Any], None]:
    """The engine's ``on_event`` (module docstring)."""

    def on_event(e: Any) -> None:
        records.engine_event(e)
        if e.kind == "environment_flat":
            console.warning(str(e.detail.get("message", e.detail)))

    return on_event
