"""Run a command so that it can never outlive the process that asked for it.

    python -m telescope_orchestrator.cluster.reaper --watch PID --pid-file FILE [--cpus 0,1] -- CMD [ARGS...]

The launcher forks a *reaper* into a session of its own and returns at once (exit 0 once the
reaper has written ``FILE``), so whoever kills the launcher's parent and its direct children
(Ray does, when an actor dies) cannot kill the reaper before it cleans up. The reaper starts the
command in a process group of its own (vLLM's API server, engine core and workers all land
there) and kills that whole group when any of these happens:

- the watched process ``PID`` is gone (the Ray actor that owns the vLLM server: a killed driver,
  actor or Ray node leaves nothing behind);
- the reaper receives SIGTERM or SIGINT (a normal stop);
- the command exits (stray children included).

``--cpus`` confines the reaper, and so the command and every process it starts, to those cores
(a vLLM server's whole tree on its share of a CPU node, ``cluster.actors.cpu_plan``).

``FILE`` holds ``<reaper pid> <command pid>`` and, once the command has exited, a second line
with its exit code (``-N``: killed by signal N; ``128 + N``: stopped by the reaper on signal N),
written before the rest of the group is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

GRACE_S = 15.0
POLL_S = 0.5


UNKNOWN_EXIT = -1000
"""The exit code of a command whose reaper died before it could record the real one."""


def describe_exit(code: int) -> str:
    """How a command ended, for messages: ``exited with code 1``, ``was killed by SIGKILL``."""
    if code == UNKNOWN_EXIT:
        return "exited (its reaper died before recording the exit code)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"was stopped on {signal.Signals(code - 128).name} (exit code {code})"
    return f"exited with code {code}"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def kill_group(pgid: int, grace_s: float = GRACE_S, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after the grace period.

    ``reap`` (e.g. ``Popen.poll`` of the group leader when it is our child) is called while
    waiting: an unreaped zombie leader keeps the group alive until the grace period ends.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _reap(cmd: list[str], watch: int | None, pid_file: Path) -> int:
    proc = subprocess.Popen(cmd, start_new_session=True)
    tmp = pid_file.with_name(pid_file.name + ".tmp")
    tmp.write_text(f"{os.getpid()} {proc.pid}\n")
    tmp.replace(pid_file)  # atomic: the launcher never reads half a line

    def finish(code: int) -> int:
        # the code first: whoever watches the command learns how it ended while the rest of its
        # group is still being stopped (up to GRACE_S)
        with contextlib.suppress(OSError), pid_file.open("a") as fh:
            fh.write(f"{code}\n")
        kill_group(proc.pid, reap=proc.poll)
        return code

    def on_signal(signum: int, frame: object) -> None:
        os._exit(finish(128 + signum))

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        code = proc.poll()
        if code is not None:
            return finish(code)
        if watch is not None and not pid_alive(watch):
            proc.send_signal(signal.SIGTERM)
            return finish(128 + signal.SIGTERM)
        time.sleep(POLL_S)


def _cores(parser: argparse.ArgumentParser, cpus: str) -> set[int]:
    """The cores of ``--cpus`` (``"0,1"``); anything else is a usage error (exit 2)."""
    try:
        return {int(c) for c in cpus.split(",")}
    except ValueError:
        parser.error(f"--cpus takes comma-separated core numbers, not {cpus!r}")


def main(argv: list[str]) -> int:
    """The command line (module docstring): start the command, then watch; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m telescope_orchestrator.cluster.reaper")
    parser.add_argument("--watch", type=int, help="stop the command when this process is gone")
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--cpus", help="comma-separated cores the command and its children run on")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("a command is needed after --")
    args.pid_file.unlink(missing_ok=True)
    if args.cpus:  # set before the fork: the reaper, the command and everything it starts inherit it
        try:
            os.sched_setaffinity(0, _cores(parser, args.cpus))
        except OSError as err:
            mine = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            print(
                f"reaper: cannot run on cores {args.cpus} ({err.strerror}); this process may use {mine}",
                file=sys.stderr,
            )
            return 2
    if os.fork() > 0:  # the launcher: wait until the reaper has started the command, then leave
        deadline = time.monotonic() + 60
        while not args.pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return 0 if args.pid_file.exists() else 1
    os.setsid()
    os._exit(_reap(cmd, args.watch, args.pid_file))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
