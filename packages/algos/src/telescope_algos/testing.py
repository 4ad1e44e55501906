"""For tests of code that runs on several ``torch.distributed`` ranks: one script on N local
processes over gloo, the way ``torchrun`` would start them, with a timeout.

``run_ranks(script, args, world=2, log_dir=tmp)`` starts ``python script *args`` as ranks
``0..world-1`` (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``OMP_NUM_THREADS=1``), each writing its output to ``log_dir/rank_<r>.log``, and waits. When one
rank fails or the time runs out, every rank is killed and an ``AssertionError`` shows each rank's
exit code and the end of its log. What the ranks compute they write to files of the caller's
choosing. The trainer backends' tests and the cross-backend tests use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["free_port", "run_ranks"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_env(rank: int, world: int, port: int, env: Mapping[str, str] | None) -> dict[str, str]:
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> bool:
    """Wait until every rank exited, one failed, or ``timeout_s`` passed; True on the timeout."""
    deadline = time.monotonic() + timeout_s
    while None in (codes := [p.poll() for p in procs]):
        if any(code not in (None, 0) for code in codes):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def run_ranks(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    world: int,
    log_dir: str | os.PathLike[str],
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run ``script`` on ``world`` ranks (module docstring); ``env``: more variables for every rank."""
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    timed_out, codes = _run_once(script, args, world, logs, timeout_s, env)
    for _ in range(2):  # two more tries when rank 0 lost its port
        if not (any(codes) and _lost_port_race(logs, world)):
            break
        timed_out, codes = _run_once(script, args, world, logs, timeout_s, env)
    if timed_out or any(codes):
        why = f"did not finish within {timeout_s:.0f} s" if timed_out else "failed"
        tails = "\n".join(
            f"--- rank {r} (exit {codes[r]})\n" + (logs / f"rank_{r}.log").read_text(errors="replace")[-3000:]
            for r in range(world)
        )
        raise AssertionError(f"{Path(script).name} on {world} rank(s) {why}: exit codes {codes}\n{tails}")


def _lost_port_race(logs: Path, world: int) -> bool:
    """True when rank 0 could not listen on ``MASTER_PORT``: another process took the free port between
    ``free_port()`` and the rank's bind (an outgoing connection may get it from the kernel). The ranks
    then never started their work, so ``run_ranks`` starts them again on another port."""
    log = logs / "rank_0.log"
    return log.exists() and "EADDRINUSE" in log.read_text(errors="replace")


def _run_once(
    script: str | os.PathLike[str],
    args: Sequence[str],
    world: int,
    logs: Path,
    timeout_s: float,
    env: Mapping[str, str] | None,
) -> tuple[bool, list[int | None]]:
    """Start the ranks on a fresh port and wait; (timed out, exit codes). Every rank is gone on return."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(world):
        with (logs / f"rank_{rank}.log").open("wb") as log:
            command = [sys.executable, str(script), *args]
            procs.append(
                subprocess.Popen(
                    command, env=_rank_env(rank, world, port, env), stdout=log, stderr=subprocess.STDOUT
                )
            )
    try:
        timed_out = _wait_all(procs, timeout_s)
    finally:  # a rank failed, the time ran out or Ctrl-C: the others may wait in a collective forever
        for p in procs:
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=30)
    return timed_out, [p.returncode for p in procs]
