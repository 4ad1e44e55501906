"""Finding runs, their status and progress, config marks, diffs and log tails."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from telescope_ui import RunIndex, UiError, check_roots
from telescope_ui._metrics import MetricsCache, discarded_by_reason, metric_columns
from telescope_ui._runs import config_diff, log_tail, progress, read_config, status
from telescope_ui.testing import synthetic_run


def test_runs_are_found_in_folders_and_as_run_directories(tmp_path: Path) -> None:
    synthetic_run(tmp_path / "a" / "one", steps=1)
    synthetic_run(tmp_path / "b" / "one", steps=1)
    synthetic_run(tmp_path / "solo", steps=1)
    (tmp_path / "a" / "not-a-run").mkdir()
    index = RunIndex([tmp_path / "a", tmp_path / "b", tmp_path / "solo"])
    # a name taken twice gets its parent's name; a folder without a record is not a run
    assert [r.name for r in index.runs()] == ["a/one", "b/one", "solo"]
    one = index.get("a/one")
    assert one is not None
    assert one.path == (tmp_path / "a" / "one").resolve()
    assert index.get("../a") is None


def test_missing_roots_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UiError, match=r"telescope train writes them under \./runs"):
        check_roots([tmp_path / "nope"])


def test_user_keys_are_read_from_the_marks(tmp_path: Path) -> None:
    config, user = read_config(synthetic_run(tmp_path / "r", steps=2))
    assert config["model"] == "tiny-model"
    assert config["environments"] == [{"name": "countdown"}, {"name": "wordle"}]
    assert user == ["model", "learning_rate", "number_of_steps", "environments"]


def test_a_mark_on_the_line_above_a_folded_scalar(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("# set by you\nsystem_prompt: >-\n  long\n  text\nseed: 3\n")
    config, user = read_config(tmp_path)
    assert user == ["system_prompt"]
    assert config == {"system_prompt": "long text", "seed": 3}


def test_config_diff_lists_changed_added_and_removed_keys() -> None:
    diff = config_diff({"a": 1, "b": [1], "c": 3}, {"a": 1, "b": [2], "d": 4})
    assert diff == [
        {"key": "b", "a": [1], "b": [2]},
        {"key": "c", "a": 3, "b": None},
        {"key": "d", "a": None, "b": 4},
    ]


def test_log_tail_filters_by_level_and_reads_from_the_end(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        json.dumps({"event": f"e{i}", "level": "warning" if i % 3 == 0 else "info"}) for i in range(5000)
    ]
    (logs / "telescope.jsonl").write_text("\n".join([*lines, "not json"]) + "\n")
    tail = log_tail(tmp_path, lines=3)
    assert [e["event"] for e in tail] == ["e4998", "e4999", "not json"]
    warnings = log_tail(tmp_path, lines=2, level="warning")
    assert [e["event"] for e in warnings] == ["e4995", "e4998"]  # 4995 and 4998 are multiples of 3


def _age(run: Path) -> None:
    old = time.time() - 3600
    for f in (
        "metrics.jsonl",
        "records/manifest.json",
        "records/infra",
        "logs/telescope.jsonl",
        "config.yaml",
    ):
        os.utime(run / f, (old, old))


def test_status_from_the_stop_events_then_liveness(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "r", steps=1, finished=False)
    finished = {0: {"reason": "finished"}}
    assert status(run, finished, 0) == {"status": "finished", "reason": "finished"}
    assert status(run, {0: {"reason": "RolloutError: no prompt fits"}}, 0)["status"] == "failed"
    assert status(run, {0: {"reason": "KeyboardInterrupt: "}}, 0)["status"] == "stopped"
    assert status(run, {}, 0)["status"] == "running"  # files written just now
    # a resumed attempt without its stop yet, while files change: running
    assert status(run, finished, 1)["status"] == "running"
    _age(run)
    assert status(run, {}, 0) == {"status": "killed", "reason": "the run stopped without recording its end"}
    # `telescope eval` adds an attempt without a stop event: the run stays finished
    assert status(run, finished, 1)["status"] == "finished"


def test_a_live_driver_of_this_machine_is_running(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "r", steps=1, finished=False)
    _age(run)
    code = "import time; time.sleep(60)"
    driver = subprocess.Popen([sys.executable, "-c", code, "telescope", "train"])  # a telescope command
    other = subprocess.Popen([sys.executable, "-c", code])  # a pid reused by another program
    try:
        # right after the fork the child's command line is still this process's: wait for the exec
        # (a loaded CI machine once checked too early and found no driver)
        deadline = time.monotonic() + 30
        while b"telescope" not in Path(f"/proc/{driver.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the driver stand-in never started"
            time.sleep(0.05)
        for proc in (driver, other):
            name = f"a000-{socket.gethostname()}-{proc.pid}-000001.parquet"
            pq.write_table(pa.table({"time": [1.0]}), run / "records" / "infra" / name)
        _age(run)
        assert status(run, {}, 0)["status"] == "running"
        driver.kill()
        driver.wait()
        assert status(run, {}, 0)["status"] == "killed"  # the other process is no driver
    finally:
        for proc in (driver, other):
            proc.kill()
            proc.wait()


def test_progress_and_eta_from_the_last_steps() -> None:
    metrics = [{"step": s, "timing/step_s": 10.0 if s < 5 else 20.0} for s in range(1, 7)]
    metrics.append({"step": 6, "eval/step": 6})
    # 4 steps left at the mean of the last ten steps: (4 * 10 + 2 * 20) / 6 = 13.33 s each
    assert progress(metrics, 10, running=True) == {
        "step": 6,
        "total_steps": 10,
        "eta_s": pytest.approx(4 * 80 / 6),
    }
    assert progress(metrics, 10, running=False)["eta_s"] is None


def test_metrics_cache_reads_what_was_appended_and_rereads_a_shorter_file(tmp_path: Path) -> None:
    file = tmp_path / "metrics.jsonl"
    file.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # the second line is being written
    cache = MetricsCache()
    assert [m["step"] for m in cache.lines(tmp_path)] == [1]
    with file.open("a") as fh:
        fh.write('ss": 1.0}\n{"step": 3}\n')
    assert [m["step"] for m in cache.lines(tmp_path)] == [1, 2, 3]
    file.write_text('{"step": 1, "loss": 9.0}\n')  # a resume dropped steps 2 and 3
    assert cache.lines(tmp_path) == [{"step": 1, "loss": 9.0}]
    # rewritten in place and grown past what was read before the next look: read again
    file.write_text('{"step": 1, "loss": 7.0}\n{"step": 2, "loss": 6.0}\n{"step": 3, "loss": 5.0}\n')
    assert [m["loss"] for m in cache.lines(tmp_path)] == [7.0, 6.0, 5.0]


def test_metric_columns_and_discarded_counts() -> None:
    lines = [
        {"step": 1, "loss": 1.0, "derived/discarded/zero_advantage_count": 2, "derived/cancelled_count": 1},
        {"step": 1, "eval/step": 1, "eval/x/correct": 0.5},
        {"step": 2, "reward/mean": 0.5, "derived/discarded/max_async_count": 1},
    ]
    cols = metric_columns(lines)
    assert cols["columns"]["loss"] == [1.0, None]
    assert cols["columns"]["reward/mean"] == [None, 0.5]
    assert "eval/x/correct" not in cols["keys"]
    assert discarded_by_reason(lines) == {
        "steps": [1, 2],
        "reasons": {"max_async": [0, 1], "zero_advantage": [2, 0]},
        "cancelled": [1, 0],
    }
