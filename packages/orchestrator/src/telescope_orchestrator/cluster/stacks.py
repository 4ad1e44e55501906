"""``kill -USR1 <driver pid>``: what a run that seems stuck is waiting for, and the run goes on.

Appends to ``logs/stacks.txt`` every thread's stack (``faulthandler``, which works even while the
main thread is blocked in C) and then, once Python code runs again, every asyncio task of the
driver's event loop with the coroutine stack it is suspended in (a thread stack only shows the
loop itself). See docs/troubleshooting.md.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

__all__ = ["dump_stacks_on_sigusr1"]


def dump_stacks_on_sigusr1(path: Path) -> Callable[[], None]:
    """Install the SIGUSR1 handlers; ``path`` is opened once, in append mode, and kept open until
    the returned function removes faulthandler's handler and closes it (the Python handler is the
    caller's to put back)."""
    out = path.open("a", encoding="utf-8", buffering=1)

    def tasks(signum: int, frame: FrameType | None) -> None:
        loop = asyncio._get_running_loop()
        if loop is None:
            out.write("no asyncio event loop is running\n\n")
            return
        pending = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
        text = io.StringIO()  # one write: a reader never sees the header without the stacks
        text.write(f"{len(pending)} asyncio tasks at {time.strftime('%Y-%m-%dT%H:%M:%S')}:\n")
        for task in pending:
            task.print_stack(file=text)
        out.write(text.getvalue() + "\n")
        out.flush()

    signal.signal(signal.SIGUSR1, tasks)
    # the threads at once (signal-safe), then the Python handler above once the main thread runs
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=True)

    def remove() -> None:
        faulthandler.unregister(signal.SIGUSR1)
        out.close()

    return remove
