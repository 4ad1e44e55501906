"""Run a command so that it can never outlive whoever started it.

    python -m telescope_cli._reaper -- COMMAND [ARGS...]

The command runs in a process group of its own (vLLM's API server, engine core and workers all
land there). This small process waits for it and kills the whole group when any of these
happens: its parent dies (even by SIGKILL: Linux ``PR_SET_PDEATHSIG``), it receives SIGTERM or
SIGINT, or the command exits (stray children included). The Ray actor that owns a vLLM server
starts it through here, so a killed driver, actor or Ray node leaves no vLLM process behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

GRACE_S = 15.0


def _kill_group(pgid: int) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after the grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m telescope_cli._reaper -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    proc = subprocess.Popen(argv, start_new_session=True)

    def stop(signum: int, frame: object) -> None:
        _kill_group(proc.pid)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        stop(signal.SIGTERM, None)
    code = proc.wait()
    _kill_group(proc.pid)  # children the command left behind
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
