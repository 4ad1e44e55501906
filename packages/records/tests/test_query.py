"""DuckDB over a run directory and over a folder of runs: one glob per table."""

from __future__ import annotations

import json

import pytest

from telescope_records import TABLES, RecordWriter, connect, table_glob


def _run(path, rewards):
    w = RecordWriter(path)
    for step, reward in enumerate(rewards, start=1):
        w.write_step("samples", step, [{"step": step, "sample_id": 0, "status": "kept", "reward": reward}])
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in range(1, len(rewards) + 1))
        + json.dumps({"step": len(rewards), "eval/step": len(rewards), "eval/quiz/correct": 0.5})
        + "\n"
    )
    return w


def test_one_run_one_glob_per_table_with_the_run_name(tmp_path):
    run = tmp_path / "runs" / "a"
    _run(run, [0.0, 0.5, 1.0])
    assert table_glob(run, "samples") == f"{run}/records/samples/*.parquet"
    con = connect(run)
    assert con.execute("select step, reward, run from samples order by step").fetchall() == [
        (1, 0.0, "a"),
        (2, 0.5, "a"),
        (3, 1.0, "a"),
    ]
    assert con.execute("select count(*) from metrics where loss is not null").fetchone() == (3,)
    assert con.execute('select "eval/quiz/correct" from metrics where "eval/step" = 3').fetchone() == (0.5,)


def test_a_folder_of_runs_reads_every_run(tmp_path):
    runs = tmp_path / "runs"
    _run(runs / "a", [0.0, 1.0])
    _run(runs / "b", [0.25])
    con = connect(runs)
    got = con.execute("select run, count(*), sum(reward) from samples group by run order by run").fetchall()
    assert got == [("a", 2, 1.0), ("b", 1, 0.25)]
    assert con.execute("select run, max(step) from metrics group by run order by run").fetchall() == [
        ("a", 2),
        ("b", 1),
    ]


def test_tables_with_no_file_yet_are_empty_views_of_their_schema(tmp_path):
    RecordWriter(tmp_path)
    con = connect(tmp_path)
    for name, t in TABLES.items():
        columns = [d[0] for d in con.execute(f"select * from {name}").description]
        assert columns == [c.name for c in t.columns] + ["run"], name
        assert con.execute(f"select count(*) from {name}").fetchone() == (0,)
    assert con.execute("select count(*) from metrics").fetchone() == (0,)


def test_a_path_that_is_not_a_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        connect(tmp_path / "nope")
