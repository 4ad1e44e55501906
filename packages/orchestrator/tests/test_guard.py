"""The run guard: once the driver is gone, every process carrying the run's marker goes too, and
its log says which."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from telescope_orchestrator.cluster.guard import marked_processes, start_guard, sweep
from telescope_orchestrator.cluster.reaper import pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

# A "driver" that starts a marked worker in a session of its own (as Ray's daemons are), then sleeps.
DRIVER = """
import os, subprocess, sys, time
worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
print(worker.pid, flush=True)
time.sleep(300)
"""


def _wait_dead(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _wait_for_text(path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{path} was not written within {timeout_s} s")


def test_guard_kills_marked_processes_after_the_driver_is_killed(tmp_path):
    marker = f"TELESCOPE_RUN_ID={uuid.uuid4().hex}"
    key, value = marker.split("=")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], env={**os.environ, key: value}, stdout=subprocess.PIPE, text=True
    )
    assert driver.stdout is not None
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # same user, no marker
    try:
        worker = int(driver.stdout.readline())
        start_guard(marker, watch=driver.pid, log_file=tmp_path / "logs" / "guard.log")
        assert set(marked_processes(marker)) >= {driver.pid, worker}
        time.sleep(1.0)
        assert pid_alive(worker), "the guard acted while the driver was alive"
        driver.kill()
        driver.wait()
        assert _wait_dead([worker]) == [], "the marked worker survived its driver"
        assert marked_processes(marker) == []  # the guard itself has gone too
        assert pid_alive(bystander.pid), "an unmarked process was killed"
        # one line for the sweep: the PID it stopped with its command name
        log = _wait_for_text(tmp_path / "logs" / "guard.log")
        assert len(log.splitlines()) == 1
        assert f"guard sweep {marker}: SIGTERM {worker} (sleep); SIGKILL none" in log
        assert str(bystander.pid) not in log
    finally:
        for proc in (driver, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        driver.stdout.close()
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)


def _child_named(marker: str, name: str) -> int | None:
    """A marked process whose command name is ``name`` (after its exec), if any."""
    for pid in marked_processes(marker):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return pid
        except OSError:
            continue
    return None


def test_sweep_logs_what_it_signalled_and_what_it_had_to_kill(tmp_path):
    marker = f"TELESCOPE_RUN_ID={uuid.uuid4().hex}"
    key, value = marker.split("=")
    log = tmp_path / "guard.log"
    # a marked shell that ignores SIGTERM (as does its sleep, which inherits that)
    stubborn = subprocess.Popen(
        ["sh", "-c", 'trap "" TERM; echo ready; sleep 300'], env={**os.environ, key: value},
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert stubborn.stdout is not None
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while not (sleeper := _child_named(marker, "sleep")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the shell forks first and execs sleep a moment later
        assert sleeper, "the shell's sleep never started"
        assert set(marked_processes(marker)) == {stubborn.pid, sleeper}
        assert sorted(sweep(marker, grace_s=0.5, log_file=str(log))) == sorted([stubborn.pid, sleeper])
        stubborn.wait(timeout=10)
        assert _wait_dead([sleeper]) == []
        [line] = log.read_text().splitlines()
        for part in (f"{stubborn.pid} (sh)", f"{sleeper} (sleep)"):
            # in the SIGTERM list and, as both ignored it, in the SIGKILL list
            assert line.count(part) == 2, line
        # a sweep with nothing left appends its own line
        assert sweep(marker, grace_s=0.1, log_file=str(log)) == []
        assert log.read_text().splitlines()[1].endswith(f"guard sweep {marker}: SIGTERM none; SIGKILL none")
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
        stubborn.stdout.close()
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)


def _guards_of(marker: str) -> list[int]:
    """Guard processes watching for ``marker`` (found by their command line)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"telescope_orchestrator.cluster.guard" in cmdline and marker.encode() in cmdline:
            found.append(int(name))
    return [p for p in found if pid_alive(p)]


def test_a_stopped_guard_sweeps_once_and_exits_while_its_driver_lives_on(tmp_path):
    """A Python program that trains and goes on: the run's guard ends with the run."""
    marker = f"TELESCOPE_RUN_ID={uuid.uuid4().hex}"
    key, value = marker.split("=")
    worker = subprocess.Popen(["sleep", "300"], env={**os.environ, key: value}, start_new_session=True)
    stop_file = tmp_path / "guard.stop"
    try:
        guard = start_guard(marker, log_file=tmp_path / "guard.log", stop_file=stop_file)
        assert guard is not None
        assert len(_guards_of(marker)) == 1
        time.sleep(1.0)
        assert pid_alive(worker.pid), "the guard acted while the driver was alive and running"
        guard.stop()
        worker.wait(timeout=30)  # the stop's sweep: a marked process left over is stopped
        assert _wait_dead(_guards_of(marker)) == []
        assert not stop_file.exists(), "the guard left its stop file behind"
        assert f"SIGTERM {worker.pid} (sleep)" in _wait_for_text(tmp_path / "guard.log")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
