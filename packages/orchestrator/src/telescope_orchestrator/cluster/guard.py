"""The run guard: whatever ends the driver, no process of the run outlives it for long.

    python -m telescope_orchestrator.cluster.guard --watch DRIVER_PID --marker KEY=VALUE [--log FILE]

``telescope train`` puts a marker unique to this launch (``TELESCOPE_RUN_ID=<hex>``) into its
environment before it starts anything; a local Ray's daemons, the actors, the vLLM servers and
their reapers all inherit it. The guard is forked into a session of its own (the launcher returns
at once) and waits for the driver to be gone:

- after a normal end, Ctrl-C or SIGTERM the driver has already stopped everything, and the guard
  finds nothing to do;
- a driver that lives on after its run (a Python program calling ``train`` again) ends the guard
  with ``Guard.stop``: it sweeps once and exits;
- after a SIGKILL or a crash it SIGTERMs every process that carries the marker, SIGKILLs what is
  left after a grace period, and exits. Without it, Ray's per-node agents of a local Ray wait on
  a GCS that is gone (a 60 s publish timeout inside Ray) before they exit.

With ``--log`` (``telescope train`` passes the run's ``logs/guard.log``) it appends one line per
sweep: the PIDs it signalled with their command names, and those it had to SIGKILL; its own
output goes nowhere else (stdin/stdout/stderr are ``/dev/null``).

Processes of a Ray cluster the run only joined were not started from this environment and are
never touched. Linux only (it reads ``/proc``); elsewhere :func:`start_guard` does nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from telescope_orchestrator.cluster.reaper import pid_alive

__all__ = ["Guard", "command_names", "marked_processes", "start_guard", "sweep"]

GRACE_S = 5.0
POLL_S = 0.5


def marked_processes(marker: str, *, exclude: tuple[int, ...] = ()) -> list[int]:
    """PIDs whose environment holds the entry ``marker`` (``KEY=VALUE``), zombies left out."""
    entry = marker.encode()
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if entry in env.split(b"\0") and pid_alive(int(name)):
            found.append(int(name))
    return found


def command_names(pids: list[int]) -> dict[int, str]:
    """``{pid: command name}`` from ``/proc/<pid>/comm`` ("?" for a process already gone)."""
    names: dict[int, str] = {}
    for pid in pids:
        try:
            names[pid] = Path(f"/proc/{pid}/comm").read_text(errors="replace").strip() or "?"
        except OSError:
            names[pid] = "?"
    return names


def _listing(names: dict[int, str]) -> str:
    return ", ".join(f"{pid} ({name})" for pid, name in names.items()) or "none"


def sweep(marker: str, grace_s: float = GRACE_S, log_file: str | None = None) -> list[int]:
    """SIGTERM every marked process, SIGKILL the rest after ``grace_s``; return those signalled.

    With ``log_file``, append one line saying which PIDs (and commands) were signalled and killed.
    """
    me = (os.getpid(),)
    signalled = marked_processes(marker, exclude=me)
    names = command_names(signalled)
    killed: dict[int, str] = {}
    for pid in signalled:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := marked_processes(marker, exclude=me)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(10):  # a dying parent may still start a child: repeat until none is left
        if not left:
            break
        killed.update({p: names.get(p) or n for p, n in command_names(left).items()})
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        left = marked_processes(marker, exclude=me)
    if log_file:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        line = f"{stamp} guard sweep {marker}: SIGTERM {_listing(names)}; SIGKILL {_listing(killed)}\n"
        with contextlib.suppress(OSError):
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            with open(log_file, "a", encoding="utf-8") as fh:
                fh.write(line)
    return signalled


class Guard:
    """A started guard: :meth:`stop` ends it once the run stopped (a driver that lives on, e.g. a
    Python program that trains twice, keeps no guard of a finished run)."""

    def __init__(self, stop_file: Path) -> None:
        self.stop_file = stop_file

    def stop(self) -> None:
        """Tell the guard the run is over: it sweeps once more (finding nothing after a clean stop)
        and exits within ``POLL_S``."""
        with contextlib.suppress(OSError):
            self.stop_file.parent.mkdir(parents=True, exist_ok=True)
            self.stop_file.touch()


def start_guard(
    marker: str,
    watch: int | None = None,
    log_file: str | os.PathLike[str] | None = None,
    *,
    stop_file: str | os.PathLike[str] | None = None,
) -> Guard | None:
    """Start the guard for this process (the driver); returns at once (None off Linux).

    ``log_file``: where the guard appends a line per sweep (what it stopped); ``stop_file``: the
    file whose creation ends the guard (``Guard.stop``; default: none, it waits for the driver)."""
    if not sys.platform.startswith("linux"):
        return None
    watched = str(watch or os.getpid())
    cmd = [
        sys.executable,
        "-m",
        "telescope_orchestrator.cluster.guard",
        "--watch",
        watched,
        "--marker",
        marker,
    ]
    if log_file is not None:
        cmd += ["--log", str(Path(log_file).absolute())]
    stop = Path(stop_file).absolute() if stop_file is not None else None
    if stop is not None:
        stop.unlink(missing_ok=True)
        cmd += ["--stop-file", str(stop)]
    subprocess.run(cmd, check=True, timeout=60, stdin=subprocess.DEVNULL)
    return Guard(stop) if stop is not None else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m telescope_orchestrator.cluster.guard")
    parser.add_argument("--watch", type=int, required=True, help="the driver's PID")
    parser.add_argument("--marker", required=True, help="KEY=VALUE environment entry of the run's processes")
    parser.add_argument("--grace", type=float, default=GRACE_S)
    parser.add_argument("--log", default=None, help="append one line per sweep (PIDs stopped) to this file")
    parser.add_argument("--stop-file", default=None, help="sweep and exit once this file exists")
    args = parser.parse_args(argv)
    if "=" not in args.marker:
        parser.error("--marker must be KEY=VALUE")
    if os.fork() > 0:
        return 0
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # hold none of the driver's pipes open
        os.dup2(devnull, fd)
    stop = Path(args.stop_file) if args.stop_file else None
    while pid_alive(args.watch) and not (stop is not None and stop.exists()):
        time.sleep(POLL_S)
    sweep(args.marker, args.grace, args.log)
    if stop is not None:
        stop.unlink(missing_ok=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
