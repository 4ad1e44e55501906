"""A step waiting for its batch says how the batch is going: on the console, in the log and in the
record, with the groups dropped for it so far when it looks stalled.

A batch that takes longer than ``event_upload_interval_seconds`` (a run whose groups are all
dropped, slow rewards, a server being restarted) is reported at each interval, from the engine's
own counts (``RolloutEngine.progress()``): the terminal's progress bar shows the line, the log gets
"waiting for a batch" and the record a ``batch_waiting`` event. A *full* report comes after two
intervals of waiting and then every six (10 s, then every 30 s with the default 5): a plain
console (a pipe, CI) prints the line::

    step 3/15  waiting 25 s: kept 0/2 groups, dropped 14 (zero_advantage 14), 4 in flight; every
    finished group scored 0.0

and, when the step looks stalled (no group kept yet, and at least a batch's worth discarded), the
groups dropped so far and the events logged so far go into the record (docs/records.md, "Files":
``step_N-dropped-aNNN-K``), so the inspector shows a stalled step while it is stalled; a step that
is merely slow writes no extra file. When the engine gives up (``RolloutError``), what it dropped
for the step is written before the error goes on (its events are left to the record's close). A
report never stops the run: what fails in one is logged.

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


async def next_batch(ctx: Any, step: int, *, clock: Callable[[], float] = time.monotonic) -> Any:
    """``ctx.engine.next_batch()``, reporting every ``event_upload_interval_seconds`` it waits
    (``clock``: the seconds it has waited are read from it)."""
    from telescope_rollout import RolloutError

    interval = float(ctx.config.event_upload_interval_seconds)
    t0 = clock()
    full_at = 2 * interval  # then every 6 intervals (module docstring)
    try:
        filling: int | None = ctx.rollout.progress().step  # the engine's batch this step gets
    except Exception:  # an engine without progress(): each report logs why it says nothing
        filling = None
    task = asyncio.ensure_future(ctx.rollout.next_batch())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            waited = clock() - t0
            full = waited >= full_at
            if full:
                full_at = waited + 6 * interval
            report(ctx, step, waited, full=full, filling=filling)
    except RolloutError:
        _write_drops(ctx, step, events=False)
        raise
    finally:
        if not task.done():
            task.cancel()


def report(ctx: Any, step: int, waited_s: float, *, full: bool, filling: int | None) -> None:
    """One report of the wait (module docstring): console, log, record. Nothing when the engine
    already handed the batch over (its counts are the next batch's); never raises."""
    from telescope_rollout.engine import progress_line

    try:
        p = ctx.rollout.progress()
        if filling is not None and p.step != filling:
            return
        ctx.console.waiting(step, waited_s, progress_line(p), plain=full)
        counts = {"kept": p.kept, "needed": p.needed, "dropped": p.dropped, "cancelled": p.cancelled}
        rewards = {
            e: {"groups": t.groups, "min": t.low, "max": t.high, "mean": t.mean} for e, t in p.rewards.items()
        }
        detail = {**counts, "in_flight": p.in_flight, "grading": p.grading, "rewards": rewards}
        log.info("waiting for a batch", step=step, waited_s=round(waited_s, 1), **detail)
        ctx.run.records.event("batch_waiting", step, waited_s=waited_s, **detail)
        stalled = p.kept == 0 and sum(p.dropped.values()) >= p.needed
    except Exception as exc:  # a report must never stop a run
        log.warning("the waiting step's report failed", step=step, error=repr(exc))
        return
    if full and stalled:
        _write_drops(ctx, step, events=True)


def _write_drops(ctx: Any, step: int, *, events: bool) -> None:
    """The groups dropped for ``step`` so far and, with ``events``, the events since the last
    write, into the record (never raises: a record must never stop a run)."""
    try:
        ctx.run.records.write_waiting(step, *ctx.rollout.pending_drops(), events=events)
    except Exception as exc:
        log.warning("the waiting step's records not written", step=step, error=repr(exc))


def on_engine_event(records: Any, console: Any) -> Callable[[Any], None]:
    """The engine's ``on_event`` (module docstring)."""

    def on_event(e: Any) -> None:
        records.engine_event(e)
        if e.kind == "environment_flat":
            console.warning(str(e.detail.get("message", e.detail)))

    return on_event
