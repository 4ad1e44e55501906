"""Lending the servers' cores to the trainer while the servers have nothing to generate.

On a CPU node the cores are split between the vLLM servers and the trainer ranks
(``cluster.actors.cpu_plan``): OpenMP threads that share a core stall each other, so while both
compute neither may use the other's cores (measured on 2 cores, SmolLM2-135M: a 512-token forward
and backward took 4.8 s on one thread, 2.9 s on two, and 80 s on two while vLLM generated on one
of them). But with ``max_async_rollout`` 1 the server generates the next batch in a fraction of the
step, then waits for the new weights, and its cores idle.

The lease: the run's loop (``run.loop``) grants step ``s`` once the rollout engine is idle until
the next weight update (``RolloutEngine.idle``: nothing under way and dispatch paused by the async
limit), no eval uses a server and no server is being restarted, for a second (``LEND_SETTLE_S``);
nothing generates again before step ``s``'s weights are published, which comes after its training,
and the grant is revoked when the step's training ends. :class:`CoreLease` is the grant, a small
file of the node (the plan exists only on one node, a Ray this run started). Each trainer rank, in
:func:`lent_threads` around its ``train_step``, reads it at module forwards (a global forward
pre-hook, checked every ``CHECK_EVERY_S``) and, once its step is granted, raises its OpenMP threads
to ``CpuPlan.lent_threads`` (the backward of that forward runs on them too); at the step's end it
goes back. ``timing/cores_lent_s`` in the step's metrics says how long a rank trained on the lent
cores. docs/architecture.md#threads.

The thread count changes where float sums are split, so a step's numbers depend on when the grant
came: a run that may train steps again on replacement ranks (``trainer_max_restarts`` with
checkpoints, ``recovery.trainers``), whose replays must match their records exactly, lends nothing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHECK_EVERY_S", "CoreLease", "LentCores", "LentTime", "lent_threads", "read_lease"]

CHECK_EVERY_S = 0.05
"""How often a rank reads the lease during a step (a read is one ``pread`` of 16 bytes)."""

_WIDTH = 16


@dataclass(frozen=True)
class LentCores:
    """What a trainer rank needs to use lent cores: the lease file and its two thread counts."""

    path: str
    threads: int
    """OpenMP threads while the servers may generate (``CpuPlan.trainer_threads``)."""
    lent_threads: int
    """OpenMP threads once the step's lease is granted (``CpuPlan.lent_threads``)."""


class CoreLease:
    """The driver's side: a file holding the last step granted the servers' cores (0: none yet)."""

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            fd, name = tempfile.mkstemp(prefix="telescope-cores-")
            os.close(fd)
            path = name
        self.path = str(path)
        self.granted = 0
        self._write(0)

    def _write(self, step: int) -> None:
        with open(self.path, "r+b" if os.path.exists(self.path) else "wb") as fh:
            fh.write(f"{step:>{_WIDTH}}".encode())  # fixed width: a reader never sees two numbers mixed

    def grant(self, step: int) -> None:
        """Step ``step``'s training may use the servers' cores until it ends."""
        if step != self.granted:
            self._write(step)
            self.granted = step

    def revoke(self) -> None:
        """No step holds the cores (a step's training ended)."""
        self.grant(0)

    def close(self) -> None:
        """Remove the file (a rank that cannot open it lends nothing)."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def read_lease(fd: int) -> int:
    """The step granted in the lease file open as ``fd`` (0 when unreadable)."""
    try:
        return int(os.pread(fd, _WIDTH, 0) or b"0")
    except (OSError, ValueError):
        return 0


@dataclass
class LentTime:
    """When a rank took the lent cores in a step (monotonic clock) and for how long it used them."""

    since: float | None = None
    seconds: float = 0.0


@contextlib.contextmanager
def lent_threads(cores: LentCores, step: int) -> Generator[LentTime]:
    """Train step ``step`` on ``cores.threads`` threads, on ``cores.lent_threads`` once it is granted.

    Runs on the thread that computes: ``torch.set_num_threads`` is applied by the forward pre-hook,
    which runs there."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    used = LentTime()
    try:
        fd = os.open(cores.path, os.O_RDONLY)
    except OSError:  # the driver is gone or removed it: nothing is lent
        yield used
        return
    next_check = 0.0

    def check(_module: Any, _args: Any) -> None:
        nonlocal next_check
        now = time.monotonic()
        if used.since is not None or now < next_check:
            return
        next_check = now + CHECK_EVERY_S
        if read_lease(fd) == step:
            torch.set_num_threads(cores.lent_threads)
            used.since = now

    handle = register_module_forward_pre_hook(check)
    try:
        yield used
    finally:
        handle.remove()
        os.close(fd)
        if used.since is not None:
            torch.set_num_threads(cores.threads)
            used.seconds = time.monotonic() - used.since
