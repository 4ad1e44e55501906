"""The run record's token table (``record.tokens``): each kept training sequence's completion tokens
with the sampler's, the trainer's, the teacher's and the reference model's view of them, and the
weight versions of the turn that generated each, worked by hand."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pyarrow.parquet as pq
import pytest

from telescope_algos import TOKEN_FIELDS, TrainingSample, pack_samples
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.record.tokens import (
    TokenTexts,
    sequences,
    token_columns,
    token_versions,
    trained_tokens,
)
from telescope_rollout import RolloutBatch, ScoredGroup, ScoredSample
from telescope_rollout.engine import TrainingSequence, Turn


def _turn(role: Literal["model", "env"], tokens: int, v0: int, v1: int, segment: int = 0) -> Turn:
    kind = "generation" if role == "model" else "tool_result"
    return Turn(index=0, role=role, turn_type=kind, tokens=tokens, version_start=v0, version_end=v1,
                segment=segment)  # fmt: skip


def _agent() -> ScoredSample:
    """Two model turns (versions 3→3, then 3→4 across a weight update) around a tool result, then a
    further sequence of one model turn."""
    return ScoredSample(
        group_id=1, sample_id=2, env_name="tools", prompt_ids=[1, 2], completion_ids=[10, 11, 12, 13, 14],
        completion_mask=[1, 1, 0, 0, 1], completion_logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0],
        version_start=3, version_end=4,
        turns=[_turn("model", 2, 3, 3), _turn("env", 2, -1, -1), _turn("model", 1, 3, 4),
               _turn("model", 2, 4, 4, segment=1)],
        extra_sequences=[TrainingSequence([1, 2, 10], [20, 21], [1, 1], [-0.1, -0.2], "history_rewritten@2")],
    )  # fmt: skip


def token_rows(step: int, batch: RolloutBatch, trained, texts: TokenTexts | None = None) -> list[dict]:
    """The token table ``token_columns`` gives, as rows."""
    from telescope_records import columns_to_arrow, table

    columns, rows = token_columns(step, batch, trained, texts)
    return columns_to_arrow(table("tokens"), {**columns, "attempt": [0] * rows}, rows).to_pylist()


def test_each_token_has_the_versions_of_the_turn_that_made_it():
    start, end = token_versions(_agent(), 0, 5)
    assert start.tolist() == [3, 3, -1, -1, 3]
    assert end.tolist() == [3, 3, -1, -1, 4]  # the last turn spanned a weight update
    assert token_versions(_agent(), 1, 2)[1].tolist() == [4, 4]
    single = ScoredSample(group_id=0, sample_id=0, env_name="e", completion_ids=[5, 6, 7],
                          completion_mask=[1, 1, 0], version_start=7, version_end=8)  # fmt: skip
    start, end = token_versions(single, 0, 3)  # no turns recorded: the sample's own, on its model tokens
    assert (start.tolist(), end.tolist()) == ([7, 7, -1], [8, 8, -1])


def _batch() -> RolloutBatch:
    plain = ScoredSample(group_id=1, sample_id=1, env_name="tools", prompt_ids=[1, 2],
                         completion_ids=[30, 31], completion_mask=[1, 1],
                         completion_logprobs=[-2.0, -3.0])  # fmt: skip
    return RolloutBatch(5, [ScoredGroup(1, "tools", [plain, _agent()])])


def test_the_trainers_rows_are_read_back_by_training_sequence_from_every_rank():
    batch = _batch()
    seqs = [seq for _, _, seq in sequences(batch)]
    assert [len(s.completion_ids) for s in seqs] == [2, 5, 2]  # plain, agent, the agent's further one
    samples = [TrainingSample(s.prompt_ids, s.completion_ids, 1.0) for s in seqs]
    shards = pack_samples(samples, seq_len=16, num_ranks=2)
    # each rank "computed" its rows: the trainer logprob of column c is -(token id) / 100
    per_rank = [
        [{f: -mb.input_ids[0].numpy() / 100 if f == "trainer_logprob" else np.ones(len(mb))
          for f in TOKEN_FIELDS} for mb in shard]
        for shard in shards
    ]  # fmt: skip
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    # rank 0 and 2 are data-parallel rank 0 (rank 2 a pipeline stage with no rows), rank 1 is dp 1
    trained = trained_tokens(shards, [0, 1, 0], [per_rank[0], per_rank[1], [None] * len(shards[0])], lengths)
    for sample, values in zip(samples, trained["trainer_logprob"], strict=True):
        expected = [-t / 100 for t in [*sample.prompt_ids, *sample.completion_ids]]
        assert values.tolist() == [np.float32(x) for x in expected]

    rows = token_rows(5, batch, trained)
    assert [(r["sample_id"], r["sequence"]) for r in rows] == [(1, 0), (2, 0), (2, 1)]
    agent = rows[1]
    assert list(agent["token_ids"]) == [10, 11, 12, 13, 14]
    assert agent["trainer_logprob"] == [float(np.float32(-t / 100)) for t in (10, 11, 12, 13, 14)]
    assert agent["sampler_logprob"] == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert agent["version_end"] == [3, 3, -1, -1, 4]
    assert agent["teacher_logprob"] is None


def test_a_teacher_in_the_trainer_fills_the_teacher_column_from_the_trainers_rows():
    batch = _batch()
    samples = [TrainingSample(s.prompt_ids, s.completion_ids, 1.0) for _, _, s in sequences(batch)]
    shards = pack_samples(samples, seq_len=16, num_ranks=1)
    fields = (*TOKEN_FIELDS, "teacher_logprob")
    # the trainer's teacher logprob of column c is -(token id) / 10
    per_rank = [[{f: -mb.input_ids[0].numpy() / 10 for f in fields} for mb in shards[0]]]
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    trained = trained_tokens(shards, [0], per_rank, lengths)
    assert "ref_logprob" not in trained  # no rank held a reference model
    rows = token_rows(5, batch, trained)
    assert rows[1]["teacher_logprob"] == [float(np.float32(-t / 10)) for t in (10, 11, 12, 13, 14)]
    assert rows[1]["ref_logprob"] is None
    # a sample its teacher's servers scored keeps its own logprobs
    batch.groups[0].samples[0].teacher_logprobs = [-7.0, -8.0]
    assert token_rows(5, batch, trained)[0]["teacher_logprob"] == [-7.0, -8.0]


def test_without_the_trainers_rows_its_columns_are_nan_and_the_table_is_written(tmp_path):
    run = RunDir(tmp_path / "r")
    decode = lambda ids: "".join(f"<{t}>" for t in ids)  # noqa: E731
    run.records.write_step(5, _batch(), decode=decode, spans=[], tokens=True, trained=None)
    rows = pq.read_table(run.path / "records" / "tokens" / "step_000005.parquet").to_pylist()
    assert [(r["step"], r["group_id"], r["sample_id"], r["sequence"], r["attempt"]) for r in rows] == [
        (5, 1, 1, 0, 0), (5, 1, 2, 0, 0), (5, 1, 2, 1, 0),
    ]  # fmt: skip
    assert rows[0]["sampler_logprob"] == [-2.0, -3.0]
    assert all(math.isnan(x) for x in rows[0]["trainer_logprob"])
    assert rows[2]["token_ids"] == [20, 21]
    assert rows[2]["token_text"] == ["<20>", "<21>"]
    assert rows[1]["version_start"] == [3, 3, -1, -1, 3]
    run.records.write_step(6, _batch(), decode=None, spans=[])  # record_tokens off: no table
    assert not (run.path / "records" / "tokens" / "step_000006.parquet").exists()


def test_each_tokens_text_is_decoded_once_by_id():
    calls: list[list[int]] = []

    def decode(ids: list[int]) -> str:
        calls.append(ids)
        return "".join(f"<{t}>" for t in ids)

    texts = TokenTexts(decode)
    rows = token_rows(5, _batch(), None, texts)
    assert [r["token_text"] for r in rows] == [
        ["<30>", "<31>"],
        [f"<{t}>" for t in range(10, 15)],
        ["<20>", "<21>"],
    ]
    assert sorted(calls) == [[t] for t in (10, 11, 12, 13, 14, 20, 21, 30, 31)]
    token_rows(6, _batch(), None, texts)
    assert len(calls) == 9  # every id was known
    texts.cover(np.array([40, 10]))
    assert calls[-1] == [40]
    assert texts.texts[40] == "<40>"
    with pytest.raises(ValueError, match="below 0"):
        texts.cover(np.array([3, -1]))


def test_a_sequence_whose_logprobs_are_short_is_padded_with_nan():
    batch = _batch()
    batch.groups[0].samples[0].completion_logprobs = [-2.0]  # two tokens, one logprob
    row = token_rows(5, batch, None)[0]
    assert row["sampler_logprob"][0] == -2.0
    assert math.isnan(row["sampler_logprob"][1])
