"""A run cancelled at any point (while its process starts, while it runs) ends like a killed run:
when ``run`` has raised ``CancelledError``, no process, pipe or task of it is left."""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest

from telescope_sandbox import LocalSandbox, _local


def _record_pipes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every pipe made from now on (the sandbox's own, and those ``subprocess`` makes to start it),
    as ``(fd, "pipe:[inode]")``."""
    made: list[tuple[int, str]] = []
    pipe = os.pipe

    def recorded() -> tuple[int, int]:
        r, w = pipe()
        made.extend((fd, os.readlink(f"/proc/self/fd/{fd}")) for fd in (r, w))
        return r, w

    monkeypatch.setattr(os, "pipe", recorded)
    return made


def _still_open(made: list[tuple[int, str]]) -> list[int]:
    """The descriptors of ``made`` that still hold their pipe (a number reused since is not it)."""
    left = []
    for fd, target in made:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                left.append(fd)
        except OSError:
            continue  # closed
    return left


_SHIM = b"The helper that runs first inside the sandbox"  # in the command line of bubblewrap and the shim


def _alive(argv: list[str]) -> list[str]:
    """The sandboxes this process started (bubblewrap, or the helper without it) and the processes
    (any PID namespace's, as the host sees them) that run ``argv``, the sandbox's program."""
    me, found = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")[:-1]
        except OSError:
            continue  # already gone
        ours = fields[1] == me and any(_SHIM in part for part in cmdline)
        if fields[0] != "Z" and (ours or cmdline == [a.encode() for a in argv]):
            found.append(f"{pid}: {b' '.join(cmdline).decode(errors='replace')[:80]}")
    return found


async def _cancel_at_every_point(box: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _record_pipes(monkeypatch)
    # a command line no other test runs, here or in another worker (tests reseed `random`)
    argv = ["sleep", f"30.{os.getpid()}{secrets.randbelow(10**6)}"]
    # cancelled after 0, 1, 2, ... turns of the event loop (while its process starts), then while
    # it runs
    for turns in [*range(60), 0.05, 0.3]:
        task = asyncio.create_task(box.run_command(argv, timeout_s=60))
        if isinstance(turns, float):
            await asyncio.sleep(turns)
        for _ in range(turns if isinstance(turns, int) else 0):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(10):  # it ends at once, not when its program would (30 s)
                await task
        assert asyncio.all_tasks() == {asyncio.current_task()}, turns
        assert _still_open(made) == [], turns
        assert _alive(argv) == [], turns
    assert len(made) > 100  # the runs got as far as their pipes


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_a_run_cancelled_at_any_point_leaves_no_process_pipe_or_task(
    sandbox: LocalSandbox, isolation: str, monkeypatch: pytest.MonkeyPatch
):
    box = sandbox if isolation == "bwrap" else LocalSandbox(isolation="none")
    await _cancel_at_every_point(box, monkeypatch)


async def test_a_kill_that_cannot_wait_for_bubblewrap_to_name_init_still_leaves_nothing(
    sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
):
    """A kill waits for bubblewrap to name the sandbox's init (killing bubblewrap too early would
    leave the sandbox running), at most ``INIT_NAMED_S``: then it takes bubblewrap's child, or kills
    bubblewrap where it has none yet."""
    monkeypatch.setattr(_local, "INIT_NAMED_S", 0.0)
    await _cancel_at_every_point(sandbox, monkeypatch)
