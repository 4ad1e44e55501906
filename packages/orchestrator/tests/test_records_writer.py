"""The run's record as the loop writes it: samples whole, turns, tool calls, rollout and
orchestrator events, eval samples, resume (docs/records.md)."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.record.writer import (
    RunRecords,
    rollout_event_rows,
    sample_row,
    tool_call_rows,
    turn_rows,
)
from telescope_rollout import DroppedGroup, EvalResult, RolloutBatch, ScoredGroup, ScoredSample
from telescope_rollout.engine import TrainingSequence, Turn


def _turn(index, role, start, end, **kw):
    base: dict[str, Any] = dict(
                index=index, role=role, turn_type="generation" if role == "model" else "tool_result",
                text=f"t{index}", tokens=3, prompt_tokens=5 if role == "model" else -1, stop_reason=None,
                server="http://a" if role == "model" else "", version_start=1, version_end=2, start=start,
                end=end, request_id=f"sample-7-turn-{index}", timings={"e2e_s": end - start})  # fmt: skip
    base.update(kw)
    return Turn(**base)


def _sample(**kw):
    base: dict[str, Any] = dict(
        env_name="tools", group_id=3, sample_id=7, sample_index=11, reward=1.0, advantage=0.5,
        prompt_text="Use the tool.", system_prompt="You are terse.", completion_text="call → 2",
        prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6, 7], completion_mask=[1, 1, 0, 1], finish_reason="stop",
        is_truncated=False, num_turns=2, version_start=1, version_end=2, off_policy_steps=1, server="http://a",
        lane=0, error=None, error_detail="", metrics={"correct": 1.0}, golden_answers={"correct": "2"},
        info_turns=[{"info_key": "k", "info_value": "v"}], sample_tags={"level": "easy"},
        timings={"queue_s": 0.5, "generation_s": 2.0, "reward_s": 0.25},
        dispatched_at=100.0, reward_start=103.0, reward_end=103.25, finished_at=103.25,
        turns=[_turn(0, "model", 100.5, 101.0), _turn(1, "env", 101.0, 101.5),
               _turn(2, "model", 101.5, 102.5)],
        tool_calls=[{"generation_idx": 0, "tool_call_idx": 0, "tool_name": "add", "arguments": '{"a": 1}',
                     "raw_text": "<add>1</add>", "result": "2", "success": True, "error": None,
                     "exit_code": 0,
                     "start": 101.1, "duration_s": 0.25, "sandbox": "local", "truncated": False}],
    )  # fmt: skip
    base.update(kw)
    return ScoredSample(**base)


def test_a_sample_row_holds_the_sample_whole():
    row = sample_row(4, "kept", None, _sample(), decode=lambda ids: ",".join(map(str, ids)))
    assert row["trainer_input"] == "1,2,3,4,5,6,7"
    assert (row["prompt_tokens"], row["completion_tokens"], row["model_tokens"]) == (3, 4, 3)
    assert (row["system_prompt"], row["sample_index"], row["golden_answers"]) == (
        "You are terse.",
        11,
        {"correct": "2"},
    )
    assert (row["queue_s"], row["generation_s"], row["reward_s"]) == (0.5, 2.0, 0.25)
    dropped = sample_row(4, "discarded", "zero_advantage", _sample(), decode=lambda ids: "x")
    assert dropped["trainer_input"] is None  # only kept samples reach the trainer


def test_an_agent_sample_of_two_sequences_records_both_with_the_reason():
    second = TrainingSequence([1, 2], [8, 9], [1, 1], [-0.5, -0.5], "history_truncated")
    turns = [_turn(0, "model", 100.5, 101.0), _turn(1, "model", 101.5, 102.5, segment=1)]
    call = {"generation_idx": 0, "tool_call_idx": 0, "call_id": "call_0_0", "tool_name": "add"}
    agent = _sample(extra_sequences=[second], turns=turns, tool_calls=[call])
    row = sample_row(4, "kept", None, agent, decode=lambda ids: ",".join(map(str, ids)))
    assert row["trainer_input"] == "1,2,3,4,5,6,7\n--- sequence 2: history_truncated ---\n1,2,8,9"
    assert (row["sequences"], row["split_reasons"], row["model_tokens"]) == (2, "history_truncated", 5)
    assert [t["segment"] for t in turn_rows(4, "train", agent)] == [0, 1]
    assert tool_call_rows(4, "train", agent)[0]["call_id"] == "call_0_0"
    one = sample_row(4, "kept", None, _sample(), decode=lambda ids: "")
    assert (one["sequences"], one["split_reasons"]) == (1, "")


def test_turns_and_tool_calls_keep_their_order_and_fields():
    turns = turn_rows(4, "train", _sample())
    assert [(t["turn_index"], t["role"], t["turn_type"]) for t in turns] == [
        (0, "model", "generation"), (1, "env", "tool_result"), (2, "model", "generation"),
    ]  # fmt: skip
    assert turns[0]["e2e_s"] == 0.5
    assert turns[0]["request_id"] == "sample-7-turn-0"
    (call,) = tool_call_rows(4, "train", _sample())
    assert (call["name"], call["turn_index"], call["exit_code"], call["sandbox"]) == ("add", 0, 0, "local")


def test_rollout_events_lie_within_the_samples_lifetime():
    events = rollout_event_rows(4, "train", _sample(), final="kept")
    kinds = [e["event"] for e in events]
    assert kinds == [
        "dispatched",
        "generation",
        "env_response",
        "generation",
        "tool_execution",
        "reward",
        "kept",
    ]
    assert all(100.0 <= e["started_at"] <= e["ended_at"] <= 103.25 for e in events)
    assert {e["server"] for e in events if e["event"] == "generation"} == {"http://a"}
    tool = events[4]
    assert (tool["started_at"], tool["ended_at"], tool["detail"]) == (101.1, 101.35, "add")


def test_a_phase_that_never_happened_has_no_row_and_no_time_zero():
    # a sample cancelled after its first turn: it was never scored (the engine's own dataclass)
    turn = Turn(index=0, role="model", turn_type="generation", server="http://a", start=200.5, end=201.0)
    ids = {"group_id": 1, "sample_id": 2, "env_name": "e"}
    cancelled = ScoredSample(**ids, dispatched_at=200.0, turns=[turn], error="cancelled", finished_at=201.5)
    events = rollout_event_rows(5, "train", cancelled, final="cancelled", detail="max_async", at=999.0)
    assert [e["event"] for e in events] == ["dispatched", "generation", "cancelled"]
    assert [e["started_at"] for e in events] == [200.0, 200.5, 201.5]
    # a fake or an older engine that wrote 0.0 for "never": no reward row at the epoch either
    old = _sample(reward_start=0.0, reward_end=0.0, finished_at=0.0)
    events = rollout_event_rows(5, "train", old, final="cancelled", at=300.0)
    assert "reward" not in [e["event"] for e in events]
    assert min(e["started_at"] for e in events) == 100.0
    assert events[-1]["started_at"] == 300.0  # no finish time of its own: the caller's
    row = sample_row(5, "cancelled", "max_async", ScoredSample(group_id=1, sample_id=3, env_name="e"))
    assert (row["dispatched_at"], row["finished_at"]) == (None, None)
    # an eval sample with no time at all and no caller's time: no row rather than one at 0
    never = ScoredSample(group_id=-1, sample_id=4, env_name="e")
    assert rollout_event_rows(5, "eval:x", never, final="evaluated") == []


def _batch(step):
    kept = ScoredGroup(step * 10, "tools", [_sample(sample_id=step * 10)], sample_index=11)
    group = ScoredGroup(step * 10 + 1, "tools", [_sample(sample_id=step * 10 + 1)], sample_index=12)
    dropped = DroppedGroup(group, "zero_advantage", step=step, version=step - 1)
    return RolloutBatch(step, [kept], discarded=[dropped])


def _read(run, table, name):
    return pq.read_table(run.path / "records" / table / name).to_pylist()


def test_a_step_writes_every_table_and_its_events(tmp_path):
    run = RunDir(tmp_path / "r")
    run.records.event("startup", None, duration_s=1.5, phase="Ray")
    run.records.flush_events(0, tag="startup-a000")
    run.records.event("train_step", 1, duration_s=2.0, samples=2)
    run.records.write_step(1, _batch(1), decode=None, spans=[{"step": 1, "rank": 0, "name": "train_step"}])
    samples = _read(run, "samples", "step_000001.parquet")
    assert [(r["status"], r["reason"], r["sample_id"], r["attempt"]) for r in samples] == [
        ("kept", None, 10, 0), ("discarded", "zero_advantage", 11, 0),
    ]  # fmt: skip
    assert len(_read(run, "turns", "step_000001.parquet")) == 6
    assert len(_read(run, "tool_calls", "step_000001.parquet")) == 2
    assert _read(run, "trainer_spans", "step_000001.parquet")[0]["name"] == "train_step"
    (startup,) = _read(run, "orchestrator_events", "step_000000-startup-a000.parquet")
    assert (startup["event"], startup["step"], startup["duration_s"], startup["detail"]) == (
        "startup",
        0,
        1.5,
        '{"phase": "Ray"}',
    )
    (step_event,) = _read(run, "orchestrator_events", "step_000001.parquet")
    assert step_event["event"] == "train_step"


def test_resume_drops_later_steps_and_counts_the_attempt(tmp_path):
    run = RunDir(tmp_path / "r")
    for step in (1, 2, 3):
        run.records.write_step(step, _batch(step), decode=None, spans=[])
    again = RunRecords(tmp_path / "r")
    again.open(resume_from=1)
    assert again.attempt == 1
    names = sorted(p.name for p in (tmp_path / "r" / "records" / "samples").iterdir())
    assert names == ["step_000001.parquet"]


def test_an_eval_result_with_samples_writes_eval_rows_and_their_turns(tmp_path):
    run = RunDir(tmp_path / "r")
    rows = [
        {"sample_index": 5, "completion_index": c, "pass_json": '{"pass@2/correct": 1.0}'} for c in (0, 1)
    ]
    result = EvalResult("quiz", 2, {}, rows, samples=[_sample(sample_id=90), _sample(sample_id=91)])
    run.records.write_eval(result)
    got = _read(run, "eval_samples", "step_000002-quiz.parquet")
    assert [(r["eval"], r["sample_index"], r["completion_idx"], r["sample_id"]) for r in got] == [
        ("quiz", 5, 0, 90), ("quiz", 5, 1, 91),
    ]  # fmt: skip
    assert dict(got[0]["metrics"]) == {"correct": 1.0, "pass@2/correct": 1.0}
    turns = _read(run, "turns", "step_000002-eval-quiz.parquet")
    assert {t["source"] for t in turns} == {"eval:quiz"}


def test_what_an_environment_returns_that_cannot_be_stored_is_recorded_marked(tmp_path):
    from telescope_records import REPR_MARK, TRUNCATION_MARK

    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque>"

    huge = "y" * 1_000_000
    calls = [{"generation_idx": 0, "tool_call_idx": 0, "tool_name": "cat", "result": huge, "success": True}]
    sample = _sample(info_turns=[{"info_key": "obj", "info_value": Opaque()}], tool_calls=calls,
                     metrics={"correct": "not a number"})  # fmt: skip
    run = RunDir(tmp_path / "r")
    batch = RolloutBatch(1, [ScoredGroup(3, "tools", [sample])])
    run.records.write_step(1, batch, decode=None, spans=[])
    (row,) = _read(run, "samples", "step_000001.parquet")
    assert f'"{REPR_MARK}<Opaque>"' in row["info"]
    assert dict(row["metrics"]) == {"correct": None}
    (call,) = _read(run, "tool_calls", "step_000001.parquet")
    assert call["result"] == "y" * 65_536 + f"{TRUNCATION_MARK}{1_000_000 - 65_536} chars]"


def test_groups_dropped_while_a_step_waits_are_written_once_and_left_out_of_the_step(tmp_path):
    run = RunDir(tmp_path / "r")
    batch = _batch(1)
    batch.discarded[0].group.group_id = 5
    run.records.event("batch_waiting", 1, kept=0)
    assert run.records.write_waiting(1, batch.discarded, []) == 1
    assert run.records.write_waiting(1, batch.discarded, []) == 0  # nothing new: no file
    dropped = _read(run, "samples", "step_000001-dropped-a000-1.parquet")
    assert [(r["status"], r["reason"], r["sample_id"]) for r in dropped] == [
        ("discarded", "zero_advantage", 11)
    ]
    assert dropped[0]["finished_at"] == 103.25  # its own time, not the time of writing
    assert len(_read(run, "rollout_events", "step_000001-dropped-a000-1.parquet")) > 0
    (waiting,) = _read(run, "orchestrator_events", "step_000001-waiting-a000-1.parquet")
    assert waiting["event"] == "batch_waiting"
    names = {p.name for p in (run.path / "records" / "samples").iterdir()}
    assert "step_000001-dropped-a000-2.parquet" not in names
    # the step itself: the kept group; the dropped one is not written twice
    run.records.write_step(1, batch, decode=None, spans=[])
    assert [r["sample_id"] for r in _read(run, "samples", "step_000001.parquet")] == [10]
    # a later step's drops are written with it again
    run.records.write_step(2, batch, decode=None, spans=[])
    assert [r["sample_id"] for r in _read(run, "samples", "step_000002.parquet")] == [10, 11]


def test_a_sample_without_its_prompt_index_takes_its_groups(tmp_path):
    run = RunDir(tmp_path / "r")
    group = ScoredGroup(3, "tools", [_sample(sample_index=-1)], sample_index=12)
    run.records.write_step(1, RolloutBatch(1, [group]), decode=None, spans=[])
    assert [r["sample_index"] for r in _read(run, "samples", "step_000001.parquet")] == [12]


def test_an_eval_row_with_no_sample_behind_it_is_written_from_its_own_columns(tmp_path):
    run = RunDir(tmp_path / "r")
    row = {"sample_index": 4, "completion_index": 1, "prompt": "2+2?", "completion": "4", "error": "",
           "finish_reason": "stop", "metrics_json": '{"correct": 1.0}',
           "pass_json": '{"pass@1/correct": 1}'}  # fmt: skip
    run.records.write_eval(EvalResult("quiz", 3, {}, [row]))
    (got,) = _read(run, "eval_samples", "step_000003-quiz.parquet")
    assert (got["eval"], got["sample_index"], got["completion_idx"], got["prompt"]) == ("quiz", 4, 1, "2+2?")
    assert (got["stop_reason"], got["error"], got["sample_id"]) == ("stop", None, None)
    assert dict(got["metrics"]) == {"correct": 1.0, "pass@1/correct": 1.0}
    assert (dict(got["golden_answers"]), dict(got["tags"]), got["info"]) == ({}, {}, "[]")
    assert not list((run.path / "records").glob("turns/*.parquet"))
