"""The writer: atomic step files, attempts and resume, buffered time tables, SIGKILL safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from telescope_records import FORMAT_VERSION, TABLES, RecordError, RecordWriter, read_manifest


def _files(run: Path, table: str) -> list[str]:
    return sorted(p.name for p in (run / "records" / table).iterdir())


def test_a_step_file_per_step_and_tag_with_the_attempt_filled_in(tmp_path):
    w = RecordWriter(tmp_path)
    w.write_step("samples", 3, [{"step": 3, "sample_id": 7, "reward": 1.0}])
    w.write_step("samples", 3, [{"step": 3, "sample_id": 8}], tag="eval drain")
    assert w.write_step("turns", 3, []) is None  # nothing to write: no file
    assert _files(tmp_path, "samples") == ["step_000003-eval_drain.parquet", "step_000003.parquet"]
    rows = pq.read_table(tmp_path / "records" / "samples" / "step_000003.parquet").to_pylist()
    assert [(r["attempt"], r["step"], r["sample_id"], r["reward"]) for r in rows] == [(0, 3, 7, 1.0)]
    assert not (tmp_path / "records" / "turns").exists()


def test_a_step_file_of_whole_columns_with_the_attempt_filled_in(tmp_path):
    import numpy as np

    from telescope_records import ListColumn

    w = RecordWriter(tmp_path)
    offsets, ids = np.array([0, 2, 3], dtype=np.int32), np.array([4, 5, 6], dtype=np.int32)
    columns = {"step": [2, 2], "sample_id": [1, 2], "token_ids": ListColumn(offsets, ids)}
    w.write_step_columns("tokens", 2, columns, 2)
    assert w.write_step_columns("tokens", 3, {}, 0) is None  # no row: no file
    assert _files(tmp_path, "tokens") == ["step_000002.parquet"]
    rows = pq.read_table(tmp_path / "records" / "tokens" / "step_000002.parquet").to_pylist()
    assert [(r["attempt"], r["sample_id"], r["token_ids"]) for r in rows] == [(0, 1, [4, 5]), (0, 2, [6])]


def test_the_manifest_lists_format_tables_and_attempts(tmp_path):
    RecordWriter(tmp_path)
    m = read_manifest(tmp_path)
    assert m["format"] == FORMAT_VERSION
    assert m["tables"] == {name: t.version for name, t in TABLES.items()}
    assert [a["attempt"] for a in m["attempts"]] == [0]
    assert m["attempts"][0]["resumed_from"] is None


def test_resume_drops_the_steps_after_the_checkpoint_and_starts_a_new_attempt(tmp_path):
    w = RecordWriter(tmp_path)
    for step in (1, 2, 3, 4):
        w.write_step("samples", step, [{"step": step, "sample_id": step}])
        w.write_step("trainer_spans", step, [{"step": step, "name": "train_step"}])
    w.write_step("eval_samples", 4, [{"step": 4, "eval": "quiz"}], tag="quiz")
    w.append("infra", [{"time": 1.0, "metric": "cpu", "value": 5.0}])
    w.close()
    (tmp_path / "records" / "samples" / ".step_000005.parquet.tmp-1").write_bytes(b"half")

    again = RecordWriter(tmp_path, resume_from=2)
    assert again.attempt == 1
    assert _files(tmp_path, "samples") == ["step_000001.parquet", "step_000002.parquet"]
    assert _files(tmp_path, "trainer_spans") == ["step_000001.parquet", "step_000002.parquet"]
    assert not list((tmp_path / "records" / "eval_samples").iterdir())
    assert len(_files(tmp_path, "infra")) == 1  # measurements are kept
    assert [a["resumed_from"] for a in read_manifest(tmp_path)["attempts"]] == [None, 2]


def test_a_record_of_another_format_or_table_version_is_refused_with_the_fix(tmp_path):
    RecordWriter(tmp_path)
    path = tmp_path / "records" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "tables": {**manifest["tables"], "samples": 99}}))
    now = TABLES["samples"].version
    with pytest.raises(RecordError, match=rf"table versions changed.*'samples': \(99, {now}\).*new run"):
        RecordWriter(tmp_path, resume_from=0)
    path.write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(RecordError, match="format 99"):
        RecordWriter(tmp_path, resume_from=0)
    for damaged, why in (('{"format": ', "cannot be read"), ("[1, 2]", "is not a JSON object")):
        path.write_text(damaged)
        with pytest.raises(RecordError, match=why + r".*move the run's records/ folder aside"):
            read_manifest(tmp_path)
        with pytest.raises(RecordError, match=why):
            RecordWriter(tmp_path, resume_from=0)


def test_time_tables_flush_when_due_or_full_and_on_close(tmp_path):
    w = RecordWriter(tmp_path, flush_every_s=3600, max_rows=3)
    w.append("infra", [{"time": 1.0, "metric": "a", "value": 1.0}] * 2)
    assert not (tmp_path / "records" / "infra").exists()  # buffered
    w.append("infra", [{"time": 2.0, "metric": "b", "value": 2.0}])  # 3 rows: full
    assert len(_files(tmp_path, "infra")) == 1
    w.append("infra", [{"time": 3.0, "metric": "c", "value": 3.0}])
    w.close()
    files = _files(tmp_path, "infra")
    assert len(files) == 2
    total = sum(pq.read_table(tmp_path / "records" / "infra" / f).num_rows for f in files)
    assert total == 4
    due = RecordWriter(tmp_path / "due", flush_every_s=0.0)
    due.append("infra", [{"time": 1.0, "metric": "a", "value": 1.0}])
    assert len(_files(tmp_path / "due", "infra")) == 1


def test_each_table_goes_through_the_method_of_its_key(tmp_path):
    w = RecordWriter(tmp_path)
    with pytest.raises(ValueError, match="keyed by time, not step"):
        w.write_step("infra", 1, [{"time": 1.0}])
    with pytest.raises(ValueError, match="keyed by step, not time"):
        w.append("samples", [{"step": 1}])
    with pytest.raises(KeyError, match=r"unknown record table 'sample'.*samples"):
        w.write_step("sample", 1, [{}])


def test_an_attached_writer_keeps_the_attempt_and_leaves_the_manifest_alone(tmp_path):
    RecordWriter(tmp_path)
    before = (tmp_path / "records" / "manifest.json").read_text()
    other = RecordWriter.attach(tmp_path, 0)
    other.write_attempt("setup", [{"role": "trainer:0", "node": "n"}], tag="trainer 0")
    assert (tmp_path / "records" / "manifest.json").read_text() == before
    assert _files(tmp_path, "setup") == ["attempt_000-trainer_0.parquet"]


WRITER_LOOP = textwrap.dedent(
    """
    import sys
    from telescope_records import RecordWriter
    w = RecordWriter(sys.argv[1], flush_every_s=0.0)
    step = 0
    while True:
        step += 1
        rows = [{"step": step, "sample_id": i, "completion": "x" * 5000} for i in range(200)]
        w.write_step("samples", step, rows)
        w.append("infra", [{"time": float(step), "metric": "m", "value": 1.0}] * 100)
    """
)


def test_a_writer_killed_with_sigkill_leaves_only_readable_files(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER_LOOP, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            folder = tmp_path / "records" / "samples"
            if folder.is_dir() and len(list(folder.glob("*.parquet"))) >= 5:
                break
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    for table in ("samples", "infra"):
        files = list((tmp_path / "records" / table).glob("*.parquet"))
        assert files, table
        for path in files:
            assert pq.read_table(path).num_rows > 0  # complete: the footer is there
