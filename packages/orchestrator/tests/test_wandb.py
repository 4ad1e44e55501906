"""W&B logging: offline mode works with no network and never asks for a login; the code and log
uploads take the files the config asks for."""

from __future__ import annotations

import pytest
import structlog.testing

from telescope_config.testing import make_config
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.record.wandb import code_files, log_files
from telescope_orchestrator.run.startup import _finish_wandb, _start_wandb, _wandb_mode


def test_mode_follows_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert _wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert _wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _wandb_mode() == "disabled"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_offline_run_records_metrics_in_the_run_directory(monkeypatch, tmp_path):
    import wandb

    from telescope_config import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    src = tmp_path / "project"
    _tree(src)
    monkeypatch.chdir(src)  # the code upload takes the working directory
    countdown = '[{"name": "countdown"}]'
    resolved = load_config(
        None, ["--use_wandb", "true", "--wandb_run_name", "offline_test", "--environments", countdown]
    )
    run = RunDir(src / "runs" / "r")
    (run.path / "logs").mkdir(parents=True, exist_ok=True)
    (run.path / "logs" / "telescope.jsonl").write_text('{"event": "hello"}\n')
    with structlog.testing.capture_logs() as logs:
        wb = _start_wandb(resolved.config, resolved, run)
    try:
        [upload] = [e for e in logs if e["event"] == "wandb code upload"]
        assert upload["files"] == 3  # train.py, pkg/env.py, conf/run.yaml: not big.bin, .git, data, the run
        assert wb.settings.mode == "offline"
        assert any(t.startswith("version:") for t in wb.tags)
        assert "records_format:1" in wb.tags
        assert wb.summary["setup"]["role"] == "driver"
        assert "use_wandb" in wb.config["_user_keys"]
        wb.log({"reward/mean": 0.25, "loss": 0.5}, step=1)
    finally:
        _finish_wandb(wb, resolved.config, run)
    offline = list((run.path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb")), "no W&B record written"
    assert (offline[0] / "files" / "logs" / "telescope.jsonl").read_text() == '{"event": "hello"}\n'
    assert wandb.run is None


def _tree(root):
    for rel, size in {"train.py": 10, "pkg/env.py": 10, "conf/run.yaml": 10, "big.bin": 3 * 2**20,
                      ".git/config": 10, "pkg/__pycache__/env.cpython-311.pyc": 10, "data/x.csv": 10,
                      "runs/r/metrics.jsonl": 10}.items():  # fmt: skip
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)


def test_code_files_skip_excluded_names_big_files_links_and_the_run(tmp_path):
    _tree(tmp_path)
    (tmp_path / "link.py").symlink_to(tmp_path / "train.py")
    exclude = [".git", "__pycache__", "*.pyc", "data"]
    got = code_files(tmp_path, exclude=exclude, max_mb=2.0, skip=[tmp_path / "runs" / "r"])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == ["conf/run.yaml", "pkg/env.py", "train.py"]
    assert len(code_files(tmp_path, exclude=exclude, max_mb=2.0, limit=2)) == 2


def test_log_files_follow_the_upload_switches(tmp_path):
    logs = tmp_path / "logs"
    for rel in ("telescope.jsonl", "guard.log", "ray.log", "inference/server_0.log", "trainer/rank_0.log"):
        (logs / rel).parent.mkdir(parents=True, exist_ok=True)
        (logs / rel).write_text("x")
    cfg = make_config(wandb_upload_logs=True, wandb_upload_logs_stdout=False)
    got = [p.relative_to(logs).as_posix() for p in log_files(tmp_path, cfg)]
    assert got == ["telescope.jsonl", "guard.log"]
    cfg = make_config(wandb_upload_logs=False, wandb_upload_logs_stdout=True)
    assert [p.relative_to(logs).as_posix() for p in log_files(tmp_path, cfg)] == [
        "inference/server_0.log",
        "trainer/rank_0.log",
        "ray.log",
    ]
    cfg = make_config(wandb_upload_logs=False, wandb_upload_logs_stdout=False)
    assert log_files(tmp_path, cfg) == []
