"""The reaper: a command started through it dies with whoever started it, children included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The parent starts the reaper around a shell that starts a grandchild, prints the PIDs, then waits.
PARENT = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-m", "telescope_cli._reaper", "--", "sh", "-c",
                      "sleep 300 & echo $$ $!; wait"], stdout=subprocess.PIPE, text=True)
print(p.pid, p.stdout.readline().strip(), flush=True)
p.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return "Z" not in stat.split(")")[1].split()[0]
    except OSError:
        return False


def _wait_dead(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkill_of_the_parent_kills_the_whole_command():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    reaper, shell, sleeper = map(int, parent.stdout.readline().split())
    assert all(_alive(p) for p in (reaper, shell, sleeper))
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    assert _wait_dead([reaper, shell, sleeper]) == []


def test_sigterm_to_the_reaper_stops_the_group_and_reports_it():
    proc = subprocess.Popen(
        [sys.executable, "-m", "telescope_cli._reaper", "--", "sh", "-c", "sleep 300 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
    )
    sleeper = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    proc.stdout.close()
    assert _wait_dead([sleeper]) == []


def test_the_exit_code_of_the_command_is_passed_on():
    reaper = [sys.executable, "-m", "telescope_cli._reaper"]
    assert subprocess.run([*reaper, "--", "sh", "-c", "exit 7"], check=False).returncode == 7
    assert subprocess.run(reaper, capture_output=True, check=False).returncode == 2
