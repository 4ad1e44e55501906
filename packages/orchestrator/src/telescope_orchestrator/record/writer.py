"""The run's record (docs/records.md): the rows ``telescope train`` writes, and when.

:class:`RunRecords` holds the run's :class:`telescope_records.RecordWriter` and the orchestrator's
event log. The loop calls :meth:`RunRecords.write_step` once a step is trained (its samples, kept,
discarded and cancelled, their turns, tool calls and rollout events, the trainer ranks' spans,
and the orchestrator events since the last step), :meth:`RunRecords.write_waiting` while a step
waits for its batch (the groups dropped for it so far, as they happen), :meth:`RunRecords.write_eval`
when an eval ends, and :meth:`RunRecords.close` at the end (events after the last step).

The row builders below are pure: a scored sample (``telescope_rollout.ScoredSample``) in, rows of
one table out, each column read from a typed field.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from telescope_orchestrator.record.tokens import TokenTexts, Trained
    from telescope_rollout import DroppedGroup, EvalResult, RolloutBatch, ScoredGroup, ScoredSample
    from telescope_rollout.engine import Turn

__all__ = [
    "RunRecords",
    "eval_sample_row",
    "rollout_event_rows",
    "sample_row",
    "tool_call_rows",
    "turn_rows",
]

log = structlog.get_logger()

Decode = Callable[[list[int]], str]
Row = dict[str, Any]

_TURN_TIMINGS = ("queue_s", "ttft_s", "prefill_s", "decode_s", "e2e_s")


def _when(value: float | None) -> float | None:
    """A wall-clock time, or None when it did not happen: None, or 0.0 (a turn's default start and
    end: a row at the epoch would stretch every timeline back to 1970)."""
    return float(value) if value is not None and value > 0 else None


def _common(s: ScoredSample) -> Row:
    """The columns samples and eval samples share."""
    return {
        "sample_id": s.sample_id,
        "prompt": s.prompt_text,
        "system_prompt": s.system_prompt,
        "prompt_tokens": len(s.prompt_ids),
        "completion": s.completion_text,
        "completion_tokens": len(s.completion_ids),
        "num_turns": s.num_turns,
        "stop_reason": s.finish_reason,
        "truncated": s.is_truncated,
        "metrics": dict(s.metrics),
        "golden_answers": dict(s.golden_answers),
        "tags": dict(s.sample_tags),
        "info": list(s.info_turns),
        "server": s.server,
        "error": s.error,
        "error_detail": s.error_detail or None,
        "queue_s": s.timings.get("queue_s"),
        "generation_s": s.timings.get("generation_s"),
        "reward_s": s.timings.get("reward_s"),
        "dispatched_at": _when(s.dispatched_at),
        "finished_at": _when(s.finished_at),
    }


def sample_row(
    step: int, status: str, reason: str | None, s: ScoredSample, *, decode: Decode | None = None
) -> Row:
    """One row of ``samples``; ``decode`` (kept samples) fills ``trainer_input``."""
    trainer_input = None
    if decode is not None and status == "kept":
        parts = [decode(list(s.prompt_ids) + list(s.completion_ids))]
        for k, x in enumerate(s.extra_sequences, start=2):
            parts.append(
                f"\n--- sequence {k}: {x.reason} ---\n{decode(list(x.prompt_ids) + list(x.completion_ids))}"
            )
        trainer_input = "".join(parts)
    return {
        **_common(s),
        "step": step,
        "status": status,
        "reason": reason,
        "env": s.env_name,
        "group_id": s.group_id,
        "sample_index": s.sample_index,
        "model_tokens": s.num_model_tokens,
        "reward": s.reward,
        "advantage": s.advantage,
        "version_start": s.version_start,
        "version_end": s.version_end,
        "off_policy_steps": s.off_policy_steps,
        "lane": s.lane,
        "trainer_input": trainer_input,
        "sequences": 1 + len(s.extra_sequences),
        "split_reasons": ",".join(x.reason for x in s.extra_sequences),
    }


def eval_sample_row(
    step: int, eval_name: str, sample_index: int, completion_idx: int, s: ScoredSample
) -> Row:
    """One row of ``eval_samples`` (its ``metrics`` get the pass@k / pass^k of its prompt after)."""
    return {
        **_common(s),
        "step": step,
        "eval": eval_name,
        "env": s.env_name,
        "sample_index": sample_index,
        "completion_idx": completion_idx,
    }


def _turn_row(step: int, source: str, sample_id: int, t: Turn) -> Row:
    return {
        "step": step,
        "source": source,
        "sample_id": sample_id,
        "turn_index": t.index,
        "role": t.role,
        "turn_type": t.turn_type,
        "text": t.text,
        "tokens": t.tokens,
        "prompt_tokens": t.prompt_tokens,
        "stop_reason": t.stop_reason,
        "server": t.server,
        "version_start": t.version_start,
        "version_end": t.version_end,
        "started_at": t.start,
        "ended_at": t.end,
        "request_id": t.request_id,
        **{k: t.timings.get(k) for k in _TURN_TIMINGS},
        "segment": t.segment,
    }


def turn_rows(step: int, source: str, s: ScoredSample) -> list[Row]:
    """Rows of ``turns``: every model turn and environment response of ``s``."""
    return [_turn_row(step, source, s.sample_id, t) for t in s.turns]


def tool_call_rows(step: int, source: str, s: ScoredSample) -> list[Row]:
    """Rows of ``tool_calls``: every tool call of ``s`` (the environment's records: their keys
    are ``ToolEnvironment``'s, any may be missing)."""
    return [
        {
            "step": step,
            "source": source,
            "sample_id": s.sample_id,
            "turn_index": c.get("generation_idx"),
            "call_index": c.get("tool_call_idx", i),
            "name": c.get("tool_name"),
            "arguments": c.get("arguments"),
            "raw_text": c.get("raw_text"),
            "result": c.get("result"),
            "success": c.get("success"),
            "error": c.get("error"),
            "exit_code": c.get("exit_code"),
            "started_at": c.get("start"),
            "duration_s": c.get("duration_s"),
            "sandbox": c.get("sandbox"),
            "truncated": c.get("truncated"),
            "call_id": c.get("call_id"),
        }
        for i, c in enumerate(s.tool_calls)
    ]


def rollout_event_rows(
    step: int, source: str, s: ScoredSample, *, final: str, detail: str | None = None, at: float | None = None
) -> list[Row]:
    """Rows of ``rollout_events`` for one sample: dispatched, each turn, each tool call, the reward,
    then ``final`` (kept, discarded, cancelled; ``detail`` = the reason) at its finish time (or ``at``).

    Only what happened has a row: a phase without a start time (a cancelled sample's reward, a
    prompt that never reached a server) has none, so every row's times are real wall clock."""
    rows: list[Row] = []
    group_id = s.group_id if source == "train" else -1

    def add(event: str, start: float | None, end: float | None, turn_index: int = -1, **more: Any) -> None:
        began = _when(start)
        if began is not None:
            where = {"step": step, "source": source, "sample_id": s.sample_id, "group_id": group_id}
            when = {"started_at": began, "ended_at": _when(end), "lane": s.lane, "turn_index": turn_index}
            rows.append({**where, "event": event, **when, **more})

    add("dispatched", s.dispatched_at, s.dispatched_at)
    for t in s.turns:
        kind, server = ("generation", t.server) if t.role == "model" else ("env_response", None)
        add(kind, t.start, t.end, turn_index=t.index, server=server)
    for i, c in enumerate(s.tool_calls):
        start, duration = c.get("start"), c.get("duration_s")
        end = start + duration if start is not None and duration is not None else None
        add("tool_execution", start, end, turn_index=i, detail=c.get("tool_name"))
    add("reward", s.reward_start, s.reward_end)
    end = _when(s.finished_at) or at
    add(final, end, end, detail=detail)
    return rows


class RunRecords:
    """The run's record writer and the orchestrator's event log (see the module docstring)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._writer: Any = None
        self.events: list[dict[str, Any]] = []
        self.last_step = 0
        """The last step written (events without a step are filed under it)."""
        self.steps_off = os.environ.get("TELESCOPE_BENCH_NO_STEP_RECORDS") == "1"
        """tools/bench_records.py's baseline: no per-step or eval records (never set it otherwise)."""
        self._closes = 0
        self._early: dict[int, set[int]] = {}
        """Per step, the ids of dropped groups written while it waited (:meth:`write_waiting`; keyed
        by step: step N's records are written on another thread while step N + 1 waits)."""
        self._waits = 0
        self._texts: TokenTexts | None = None
        """Each token decoded on its own, cached (``record.tokens.TokenTexts``; set at the first step)."""
        self.eval_tag = ""
        """Added to the file tags of eval records (``telescope eval``: its attempt, so that an
        in-training eval of the same step is kept)."""

    def open(self, resume_from: int | None, *, flush_every_s: float = 5.0) -> None:
        """Start this attempt's files; a resume from step N first drops the record's later steps.
        Nothing touches the disk before (start-up events wait in memory). ``flush_every_s``: how
        often the time tables are flushed (the config's ``event_upload_interval_seconds``)."""
        from telescope_records import RecordWriter

        if self._writer is None:
            self._writer = RecordWriter(self.run_dir, resume_from=resume_from, flush_every_s=flush_every_s)
            self.last_step = resume_from or 0

    @property
    def writer(self) -> Any:
        """The :class:`telescope_records.RecordWriter` (opened as a fresh attempt if not yet)."""
        self.open(None)
        return self._writer

    @property
    def attempt(self) -> int:
        return int(self.writer.attempt)

    # ----------------------------------------------------------------------- events
    def event(
        self,
        event: str,
        step: int | None,
        *,
        duration_s: float | None = None,
        at: float | None = None,
        **detail: Any,
    ) -> None:
        """Log one orchestrator event (written with the step's records); ``step`` None: the step
        the events are next written under."""
        self.events.append(
            {
                "step": step,
                "time": time.time() if at is None else at,
                "event": event,
                "duration_s": duration_s,
                "detail": detail or None,
            }
        )

    @contextlib.contextmanager
    def phase(self, event: str, step: int | None, **detail: Any) -> Generator[dict[str, Any]]:
        """Log ``event`` with the block's duration; the yielded dict adds to its detail."""
        t0, m0 = time.time(), time.monotonic()
        extra: dict[str, Any] = {}
        try:
            yield extra
        finally:
            self.event(event, step, duration_s=time.monotonic() - m0, at=t0, **detail, **extra)

    def engine_event(self, e: Any) -> None:
        """The rollout engine's ``on_event`` callback: its events join the log. The engine counts
        batches from 0, training steps count from 1: its batch ``s`` is step ``s + 1``."""
        self.event(str(e.kind), int(e.step) + 1, at=float(e.time), **dict(e.detail or {}))

    def take_events(self) -> list[dict[str, Any]]:
        """The events logged so far, leaving none (for a write on another thread)."""
        events, self.events = self.events, []
        return events

    def flush_events(
        self, step: int | None = None, tag: str = "", events: list[dict[str, Any]] | None = None
    ) -> None:
        """Write the logged events (or ``events``) into ``step``'s file (default: the last step written)."""
        step = self.last_step if step is None else step
        events = self.take_events() if events is None else events
        for e in events:
            e["step"] = step if e["step"] is None else e["step"]
        self.writer.write_step("orchestrator_events", step, events, tag=tag)

    # ----------------------------------------------------------------------- writing
    def write_step(
        self,
        step: int,
        batch: RolloutBatch,
        *,
        decode: Decode | None,
        spans: Sequence[dict[str, Any]],
        events: list[dict[str, Any]] | None = None,
        tokens: bool = False,
        trained: Trained | None = None,
    ) -> None:
        """Every record of one trained step (see the module docstring); ``events``: the orchestrator
        events to file with it (default: those logged so far). Dropped groups already written while
        the step waited (:meth:`write_waiting`) are left out. ``tokens``: the token table too, with
        the trainer's columns from ``trained`` (``record.tokens``)."""
        if self.steps_off:
            return
        groups = list(_groups(batch))
        early = self._early.pop(step, set())  # written while the step waited: left out
        groups = [g for g in groups if g[0] == "kept" or g[2].group_id not in early]
        self._write_groups(step, groups, decode=decode, tag="")
        if tokens:
            from telescope_orchestrator.record.tokens import TokenTexts, token_columns

            if decode is not None and self._texts is None:
                self._texts = TokenTexts(decode)
            columns, rows = token_columns(step, batch, trained, self._texts)
            self.writer.write_step_columns("tokens", step, columns, rows)
        self.writer.write_step("trainer_spans", step, spans)
        self.last_step = max(self.last_step, step)
        self.flush_events(step, events=events)

    def write_waiting(
        self,
        step: int,
        discarded: Sequence[DroppedGroup],
        cancelled: Sequence[DroppedGroup],
        *,
        events: bool = True,
    ) -> int:
        """While ``step`` waits for its batch: the groups dropped for it so far (``DroppedGroup`` s)
        into step files tagged ``dropped-aNNN-K`` (those written before are skipped, and the step's
        own :meth:`write_step` leaves them all out) and, with ``events`` and new groups, the events
        logged so far (tag ``waiting-aNNN-K``; a run that stops leaves them to :meth:`close`, which
        files them under the last step written). Returns the number of groups written."""
        if self.steps_off:
            return 0
        early = self._early.setdefault(step, set())
        new = [
            (status, d.reason, d.group)
            for status, drops in (("discarded", discarded), ("cancelled", cancelled))
            for d in drops
            if d.group.group_id not in early
        ]
        if not new:
            return 0
        self._waits += 1
        tag = f"a{self.attempt:03d}-{self._waits}"
        self._write_groups(step, new, decode=None, tag=f"dropped-{tag}")
        early.update(g.group_id for _, _, g in new)
        if events and self.events:
            self.flush_events(step, tag=f"waiting-{tag}")
        return len(new)

    def _write_groups(
        self,
        step: int,
        groups: Sequence[tuple[str, str | None, ScoredGroup]],
        *,
        decode: Decode | None,
        tag: str,
    ) -> None:
        """The samples, turns, tool calls and rollout events of ``(status, reason, group)`` s."""
        samples: list[Row] = []
        turns: list[Row] = []
        calls: list[Row] = []
        lifecycle: list[Row] = []
        now = time.time()
        for status, reason, group in groups:
            for s in group.samples:
                row = sample_row(step, status, reason, s, decode=decode)
                if row["sample_index"] < 0:  # not known to the sample: the group's prompt
                    row["sample_index"] = group.sample_index
                samples.append(row)
                turns += turn_rows(step, "train", s)
                calls += tool_call_rows(step, "train", s)
                lifecycle += rollout_event_rows(step, "train", s, final=status, detail=reason, at=now)
        w = self.writer
        w.write_step("samples", step, samples, tag=tag)
        w.write_step("turns", step, turns, tag=tag)
        w.write_step("tool_calls", step, calls, tag=tag)
        w.write_step("rollout_events", step, lifecycle, tag=tag)

    def write_eval(self, result: EvalResult) -> None:
        """The rows of one eval at one step (``eval_samples``, turns, tool calls, rollout events)."""
        if self.steps_off:
            return
        step, name = int(result.step), str(result.name)
        source = f"eval:{name}"
        rows: list[Row] = []
        turns: list[Row] = []
        calls: list[Row] = []
        events: list[Row] = []
        samples = result.samples
        for i, row in enumerate(result.rows):
            s = samples[i] if i < len(samples) else None
            where = (step, name, int(row.get("sample_index", -1)), int(row.get("completion_index", 0)))
            # a row with no sample behind it (a runner that gives rows only): its columns alone
            r = eval_sample_row(*where, s) if s is not None else _from_eval_row(*where, row)
            r["metrics"] = {**r["metrics"], **_pass_metrics(row)}
            rows.append(r)
            if s is None:
                continue
            turns += turn_rows(step, source, s)
            calls += tool_call_rows(step, source, s)
            events += rollout_event_rows(step, source, s, final="evaluated")
        w = self.writer
        tag = f"{name}-{self.eval_tag}" if self.eval_tag else name
        w.write_step("eval_samples", step, rows, tag=tag)
        w.write_step("turns", step, turns, tag=f"eval-{tag}")
        w.write_step("tool_calls", step, calls, tag=f"eval-{tag}")
        w.write_step("rollout_events", step, events, tag=f"eval-{tag}")

    def write_once(self, table: str, rows: Iterable[dict[str, Any]], tag: str = "") -> None:
        """Rows of an attempt table (environments, setup, model)."""
        try:
            self.writer.write_attempt(table, list(rows), tag=tag)
        except Exception as exc:  # a record must never stop a run
            log.warning("could not record the run's setup", table=table, error=repr(exc))

    def write_supervised(
        self, step: int, spans: Sequence[dict[str, Any]], events: list[dict[str, Any]]
    ) -> None:
        """A supervised step's record (``sft_steps``: conversations, no samples): its trainer spans
        and orchestrator events."""
        if self.steps_off:
            return
        try:
            self.writer.write_step("trainer_spans", step, spans)
            self.last_step = max(self.last_step, step)
            self.flush_events(step, events=events)
        except Exception as exc:  # a record must never stop a run
            log.warning("supervised step records not written", step=step, error=repr(exc))

    def write_checkpoint(
        self, step: int, spans: Sequence[dict[str, Any]], events: list[dict[str, Any]]
    ) -> None:
        """A checkpoint's trainer spans and orchestrator events, filed with its step (``-checkpoint``)."""
        try:
            self.writer.write_step("trainer_spans", step, spans, tag="checkpoint")
            self.flush_events(step, tag="checkpoint", events=events)
        except Exception as exc:  # a record must never stop a run
            log.warning("checkpoint records not written", step=step, error=repr(exc))

    def close(self) -> None:
        """Write the events logged since the last step, and flush the time tables (idempotent).

        Nothing happens before :meth:`open` (a run that stopped before its record began writes
        none, rather than a record of an attempt that never was); never raises (logged)."""
        if self._writer is None:
            return
        self._closes += 1
        try:
            self.flush_events(tag=f"end-a{self.attempt:03d}-{self._closes}")
            self.writer.close()
        except Exception as exc:
            log.warning("the run's last records not written", error=repr(exc))


def _json_numbers(text: Any) -> dict[str, float]:
    import json

    try:
        return {str(k): float(v) for k, v in json.loads(text or "{}").items()}
    except (TypeError, ValueError, AttributeError):
        return {}


def _pass_metrics(row: dict[str, Any]) -> dict[str, float]:
    return _json_numbers(row.get("pass_json"))


def _from_eval_row(step: int, eval_name: str, sample_index: int, completion_idx: int, row: Row) -> Row:
    """A row of ``eval_samples`` from an eval runner's row (``EvalResult.rows``) alone."""
    return {
        "step": step,
        "eval": eval_name,
        "sample_index": sample_index,
        "completion_idx": completion_idx,
        "prompt": row.get("prompt"),
        "completion": row.get("completion"),
        "completion_tokens": row.get("completion_tokens"),
        "stop_reason": row.get("finish_reason"),
        "num_turns": row.get("num_turns"),
        "server": row.get("server"),
        "error": row.get("error") or None,
        "metrics": _json_numbers(row.get("metrics_json")),
        "golden_answers": {},
        "tags": {},
        "info": [],
    }


def _groups(batch: RolloutBatch) -> Iterable[tuple[str, str | None, ScoredGroup]]:
    for g in batch.groups:
        yield "kept", None, g
    for status, dropped in (("discarded", batch.discarded), ("cancelled", batch.cancelled)):
        for d in dropped:
            yield status, d.reason, d.group
