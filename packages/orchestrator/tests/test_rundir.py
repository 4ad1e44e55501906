"""The run directory: where a run lands, its metrics lines."""

from __future__ import annotations

import json

import pytest

from telescope_orchestrator.record.rundir import RunDir, RunDirError, choose_run_dir


def test_named_run_goes_under_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("TELESCOPE_RUN_DIR", raising=False)
    path = choose_run_dir(explicit=None, run_name="exp1", resuming=False, root=tmp_path)
    assert path == tmp_path / "runs" / "exp1"


def test_unnamed_run_gets_a_timestamp(tmp_path, monkeypatch):
    monkeypatch.delenv("TELESCOPE_RUN_DIR", raising=False)
    path = choose_run_dir(explicit=None, run_name=None, resuming=False, root=tmp_path)
    assert path.parent == tmp_path / "runs"
    assert len(path.name) == len("20261129-223000")


def test_env_var_and_flag_pick_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TELESCOPE_RUN_DIR", str(tmp_path / "from_env"))
    assert choose_run_dir(explicit=None, run_name="x", resuming=False) == tmp_path / "from_env"
    assert choose_run_dir(explicit=str(tmp_path / "flag"), run_name="x", resuming=False) == tmp_path / "flag"


def test_a_used_directory_is_not_reused_by_a_fresh_run(tmp_path):
    run = RunDir(tmp_path / "r")
    run.append_metrics({"step": 1})
    with pytest.raises(RunDirError, match="resume_from_checkpoint"):
        choose_run_dir(explicit=str(tmp_path / "r"), run_name=None, resuming=False)
    assert choose_run_dir(explicit=str(tmp_path / "r"), run_name=None, resuming=True) == tmp_path / "r"


def test_resuming_a_missing_directory_says_how_to_fix(tmp_path):
    with pytest.raises(RunDirError, match="--run-dir"):
        choose_run_dir(explicit=str(tmp_path / "nope"), run_name=None, resuming=True)


def test_metrics_are_json_lines_and_nan_becomes_null(tmp_path):
    run = RunDir(tmp_path / "r")
    run.append_metrics({"step": 1, "loss": 0.5, "grad_norm": float("nan")})
    run.append_metrics({"step": 2, "loss": 0.25, "grad_norm": float("inf")})
    lines = run.metrics_file.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 1, "loss": 0.5, "grad_norm": None},
        {"step": 2, "loss": 0.25, "grad_norm": None},
    ]


def test_truncate_drops_steps_after_the_checkpoint(tmp_path):
    run = RunDir(tmp_path / "r")
    for step in range(1, 6):
        run.append_metrics({"step": step})
    run.truncate_metrics(3)
    assert [m["step"] for m in run.read_metrics()] == [1, 2, 3]
