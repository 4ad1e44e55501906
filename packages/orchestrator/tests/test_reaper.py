"""The reaper: a command started through it dies with the process it watches, children included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telescope_orchestrator.cluster.reaper import pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
REAPER = [sys.executable, "-m", "telescope_orchestrator.cluster.reaper"]
# A shell that starts a grandchild and waits: the whole group must go.
CMD = ["--", "sh", "-c", "sleep 300 & wait"]


def _wait_dead(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _group(pgid: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat[2]) == pgid and stat[0] != "Z":
            found.append(int(pid))
    return found


def _launch(tmp_path: Path, *extra: str) -> tuple[int, int]:
    pid_file = tmp_path / "server.pid"
    subprocess.run([*REAPER, "--pid-file", str(pid_file), *extra, *CMD], check=True, timeout=60)
    reaper, server = map(int, pid_file.read_text().split()[:2])
    deadline = time.monotonic() + 10
    while len(_group(server)) < 2 and time.monotonic() < deadline:  # sh and its sleep
        time.sleep(0.1)
    return reaper, server


def test_the_command_dies_when_the_watched_process_dies(tmp_path):
    watched = subprocess.Popen(["sleep", "300"])
    reaper, server = _launch(tmp_path, "--watch", str(watched.pid))
    group = _group(server)
    assert len(group) >= 2
    assert pid_alive(reaper)
    watched.kill()  # like SIGKILL of the Ray actor that owns a vLLM server
    watched.wait()
    assert _wait_dead([reaper, *group]) == []
    assert (tmp_path / "server.pid").read_text().splitlines()[1] == str(128 + signal.SIGTERM)


def test_sigterm_to_the_reaper_stops_the_group(tmp_path):
    reaper, server = _launch(tmp_path)
    group = _group(server)
    os.kill(reaper, signal.SIGTERM)
    assert _wait_dead([reaper, *group]) == []


def test_the_exit_code_of_the_command_is_recorded(tmp_path):
    pid_file = tmp_path / "p"
    subprocess.run([*REAPER, "--pid-file", str(pid_file), "--", "sh", "-c", "exit 7"], check=True, timeout=60)
    deadline = time.monotonic() + 20
    while len(pid_file.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.read_text().splitlines()[1] == "7"


def test_a_killed_command_reads_as_killed_at_once_never_as_unknown(tmp_path):
    """The server's view (``_Detached.poll``) after SIGKILL of the command: running until the reaper
    has recorded the code, then -9, and -9 is recorded before the rest of the group is stopped."""
    from telescope_orchestrator.cluster.actors import _Detached
    from telescope_orchestrator.cluster.reaper import describe_exit

    reaper, server = _launch(tmp_path)
    group = _group(server)
    view = _Detached(tmp_path / "server.pid")
    assert view.poll() is None
    os.kill(server, signal.SIGKILL)  # the sleep child lives on until the reaper stops the group
    seen = set()
    deadline = time.monotonic() + 30
    while (code := view.poll()) is None and time.monotonic() < deadline:
        seen.add(code)
        time.sleep(0.01)
    assert code == -signal.SIGKILL, (code, seen)
    assert code is not None
    assert describe_exit(code) == "was killed by SIGKILL"
    assert _wait_dead([reaper, *group]) == []
    assert view.wait(timeout=30) == -signal.SIGKILL


def test_kill_stops_a_group_that_ignores_sigterm_at_once(tmp_path):
    """A hung server (its API process ignoring SIGTERM, like one waiting on a stopped engine) is
    killed whole by ``_Detached.kill`` for a restart, with no grace period to sit through."""
    from telescope_orchestrator.cluster.actors import _Detached

    pid_file = tmp_path / "server.pid"
    cmd = ["--", "sh", "-c", "trap '' TERM; sleep 300 & wait"]
    subprocess.run([*REAPER, "--pid-file", str(pid_file), *cmd], check=True, timeout=60)
    view = _Detached(pid_file)
    deadline = time.monotonic() + 10
    while len(_group(view.server_pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    group = _group(view.server_pid)
    assert len(group) >= 2
    t0 = time.monotonic()
    view.kill()
    assert view.wait(timeout=10) == -signal.SIGKILL
    assert _wait_dead([view.pid, *group], timeout_s=5) == []
    assert time.monotonic() - t0 < 5  # not the reaper's grace period (15 s)


def test_exit_codes_are_described_as_a_user_reads_them():
    from telescope_orchestrator.cluster.reaper import UNKNOWN_EXIT, describe_exit

    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(-6) == "was killed by SIGABRT"
    assert describe_exit(143) == "was stopped on SIGTERM (exit code 143)"
    assert describe_exit(-200) == "was killed by signal 200"
    assert "reaper died" in describe_exit(UNKNOWN_EXIT)


def test_a_missing_command_is_a_usage_error(tmp_path):
    result = subprocess.run([*REAPER, "--pid-file", str(tmp_path / "p")], capture_output=True, check=False)
    assert result.returncode == 2
    assert b"command" in result.stderr


def test_kill_group_reaps_its_own_leader():
    """A dead leader that is our child stays a zombie (and keeps its group) until reaped.

    Without ``reap`` kill_group would wait out its whole grace period (here an hour) for that
    zombie; with it, it returns as soon as the group is gone.
    """
    import threading

    from telescope_orchestrator.cluster.reaper import kill_group

    proc = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    done = threading.Event()
    worker = threading.Thread(
        target=lambda: (kill_group(proc.pid, grace_s=3600, reap=proc.poll), done.set()), daemon=True
    )
    worker.start()
    finished = done.wait(timeout=60)
    if not finished:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert finished, "kill_group waited for a zombie group leader"
    assert proc.returncode == -signal.SIGTERM


def test_cpus_confine_the_command_and_its_children_to_those_cores(tmp_path):
    core = min(os.sched_getaffinity(0))
    out = tmp_path / "affinity"
    script = f"import os; open({str(out)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    child = ["--", "sh", "-c", f'{sys.executable} -c "{script}" & wait']  # a grandchild reports
    pid_file = tmp_path / "server.pid"
    cmd = [*REAPER, "--pid-file", str(pid_file), "--cpus", str(core), *child]
    subprocess.run(cmd, check=True, timeout=60)
    deadline = time.monotonic() + 30
    while len(pid_file.read_text().splitlines()) < 2 and time.monotonic() < deadline:  # the command's exit
        time.sleep(0.1)
    assert pid_file.read_text().splitlines()[1] == "0"
    assert out.read_text() == repr([core])


def test_a_servers_tree_runs_on_every_core_of_its_bind():
    from telescope_orchestrator.cluster.actors import server_cores

    assert server_cores("0") == "0"
    assert server_cores("2,3") == "2,3"
    assert server_cores("0,1|2,3") == "0,1,2,3"  # tensor parallel: one run per rank
    assert server_cores("0|0") == "0"  # ranks sharing a core


def test_cores_the_machine_lacks_fail_at_once_and_start_nothing(tmp_path):
    pid_file = tmp_path / "pids"
    missing = max(os.sched_getaffinity(0)) + 1000
    cmd = [*REAPER, "--pid-file", str(pid_file), "--cpus", str(missing), "--", "sh", "-c", "touch started"]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - t0 < 30  # not the minute the launcher waits for a started command
    assert f"cannot run on cores {missing}" in done.stderr
    assert not pid_file.exists()
    assert not (tmp_path / "started").exists()
    bad_cmd = [*REAPER, "--pid-file", str(pid_file), "--cpus", "0,x", "--", "true"]
    bad = subprocess.run(bad_cmd, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert "--cpus takes comma-separated core numbers, not '0,x'" in bad.stderr
