"""A run changes its driver's process only while it lasts (``startup._driver_scope``): the run's
environment markers, logging, the SIGTERM and SIGUSR1 handlers and the guard are put back or
stopped when it ends, also when it ends with an error, so a Python program can train again."""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import signal
import time

import pytest
import structlog

from telescope_orchestrator.cluster.guard import marked_processes
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.run.startup import _driver_scope


def _program_handler(signum, frame):  # the program's own handlers, to be found again afterwards
    pass


@pytest.mark.parametrize("fails", [False, True])
def test_everything_the_run_changed_is_put_back(tmp_path, monkeypatch, fails):
    monkeypatch.delenv("TELESCOPE_RUN_ID", raising=False)
    monkeypatch.setenv("TELESCOPE_RUN_DIR", "/the/programs/own")
    stream = io.StringIO()
    mine = logging.StreamHandler(stream)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [mine])
    monkeypatch.setattr(root, "level", logging.ERROR)
    sigterm = signal.signal(signal.SIGTERM, _program_handler)
    sigusr1 = signal.signal(signal.SIGUSR1, _program_handler)
    structlog_before = structlog.get_config()
    run = RunDir(tmp_path / "run")
    inside: dict[str, object] = {}
    try:
        expect = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with expect, _driver_scope(run, debug=False):
            inside["marker"] = f"TELESCOPE_RUN_ID={os.environ['TELESCOPE_RUN_ID']}"
            inside["run_dir"] = os.environ["TELESCOPE_RUN_DIR"]
            inside["sigterm"] = signal.getsignal(signal.SIGTERM)
            structlog.get_logger().info("inside the run")
            if fails:
                raise RuntimeError("the run failed")
        assert inside["run_dir"] == str(run.path)
        assert inside["sigterm"] is not _program_handler  # SIGTERM meant Ctrl-C during the run
        # after: the program's environment, handlers, logging
        assert os.environ["TELESCOPE_RUN_DIR"] == "/the/programs/own"
        assert "TELESCOPE_RUN_ID" not in os.environ
        assert signal.getsignal(signal.SIGTERM) is _program_handler
        assert signal.getsignal(signal.SIGUSR1) is _program_handler
        assert not faulthandler.unregister(signal.SIGUSR1)  # faulthandler's dump is gone too
        assert root.handlers == [mine]
        assert root.level == logging.ERROR
        logging.getLogger("after").error("the program logs on")
        assert "the program logs on" in stream.getvalue()  # its handler was set aside, not closed
        assert structlog.get_config() == structlog_before
        assert "inside the run" in run.log_file.read_text()
        deadline = time.monotonic() + 10  # the guard ends with the run: nothing carries its marker
        while marked_processes(str(inside["marker"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked_processes(str(inside["marker"])) == []
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        signal.signal(signal.SIGUSR1, sigusr1)
