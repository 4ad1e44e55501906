"""``kill -USR1`` on the driver: every thread's stack and every asyncio task's coroutine stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from telescope_orchestrator.cluster.stacks import dump_stacks_on_sigusr1

    dump_stacks_on_sigusr1(Path(sys.argv[1]))

    async def waiting_for_a_batch():
        await asyncio.sleep(30)

    async def main():
        task = asyncio.create_task(waiting_for_a_batch(), name="next-batch")
        await asyncio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.2)
        task.cancel()
        print("went on")

    asyncio.run(main())
    """
)


def test_sigusr1_appends_thread_and_task_stacks_and_the_program_goes_on(tmp_path: Path):
    out = tmp_path / "stacks.txt"
    out.write_text("earlier\n")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "went on"
    text = out.read_text()
    assert text.startswith("earlier\n")  # appended
    assert "Current thread" in text  # faulthandler's threads
    assert "most recent call first" in text
    assert "2 asyncio tasks" in text
    assert "name='next-batch'" in text
    assert "in waiting_for_a_batch" in text  # the coroutine the task is suspended in
