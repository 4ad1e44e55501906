"""The run guard: once the driver is gone, every process carrying the run's marker goes too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from telescope_cli._guard import marked_processes, start_guard
from telescope_cli._reaper import pid_alive

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


def test_guard_kills_marked_processes_after_the_driver_is_killed():
    marker = f"TELESCOPE_RUN_ID={uuid.uuid4().hex}"
    key, value = marker.split("=")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], env={**os.environ, key: value}, stdout=subprocess.PIPE, text=True
    )
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # same user, no marker
    try:
        worker = int(driver.stdout.readline())
        start_guard(marker, watch=driver.pid)
        assert set(marked_processes(marker)) >= {driver.pid, worker}
        time.sleep(1.0)
        assert pid_alive(worker), "the guard acted while the driver was alive"
        driver.kill()
        driver.wait()
        assert _wait_dead([worker]) == [], "the marked worker survived its driver"
        assert marked_processes(marker) == []  # the guard itself has gone too
        assert pid_alive(bystander.pid), "an unmarked process was killed"
    finally:
        for proc in (driver, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        driver.stdout.close()
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
