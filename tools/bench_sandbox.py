"""Benchmark telescope_sandbox's pool of LocalSandbox against a bare subprocess, in the same run.

What is timed: ``--runs`` executions of a trivial Python program (``print(sum(range(100)))``) with
``--concurrency`` of them in flight at once, twice:

* ``bare``: ``asyncio.create_subprocess_exec(python, "-c", code)`` with pipes, no isolation;
* ``sandbox``: ``SandboxPool(LocalSandbox(), max_concurrency=...).run(code)``: bubblewrap
  namespaces, the in-sandbox helper, rlimits, output capture, the deadline watch.

Both use the same interpreter (the one running this script, resolved through symlinks), so the
difference is the sandbox's cost. Each variant first does ``--warmup`` untimed runs; then the
two alternate in ``--rounds`` rounds of ``runs / rounds`` each, so a change in machine load
during the benchmark hits both alike. Latency is
one run's wall time from start to result, queue wait excluded (the harness runs exactly
``--concurrency`` workers, so nothing queues); throughput is runs divided by the variant's wall
time. ``overhead_vs_bare`` is the sandbox's p50 latency over the bare p50 latency (1.0 would be
free).

Usage: ``python tools/bench_sandbox.py [--runs 200] [--concurrency 4] [--warmup 8] [--rounds 4]``.
The last line is ``RESULT overhead_vs_bare=<ratio> runs_per_s=<sandbox runs/s> p99_ms=<sandbox p99 latency>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

CODE = "print(sum(range(100)))"
EXPECTED = "4950\n"


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _bare(python: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        python, "-c", CODE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode()


async def _measure(
    one: Callable[[], Awaitable[str]], *, runs: int, concurrency: int
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    remaining = iter(range(runs))

    async def worker() -> None:
        for _ in remaining:
            started = time.perf_counter()
            out = await one()
            latencies.append(time.perf_counter() - started)
            assert out == EXPECTED, out

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


def _report(name: str, wall: float, latencies: list[float]) -> dict[str, float]:
    row = {
        "runs_per_s": len(latencies) / wall,
        "p50_ms": _quantile(latencies, 0.50) * 1000,
        "p99_ms": _quantile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000,
    }
    print(f"{name:8s} " + "  ".join(f"{k}={v:.1f}" for k, v in row.items()))
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    from telescope_sandbox import LocalSandbox, SandboxPool

    sandbox = LocalSandbox()
    print(
        f"python {platform.python_version()} ({sandbox.python}), {os.cpu_count()} CPUs, "
        f"{platform.machine()}, euid {os.geteuid()}, runs {args.runs}, concurrency {args.concurrency}"
    )
    async with SandboxPool(sandbox, max_concurrency=args.concurrency) as pool:

        async def sandboxed() -> str:
            result = await pool.run(CODE)
            return result.stdout

        variants = {"bare": lambda: _bare(sandbox.python), "sandbox": sandboxed}
        walls = dict.fromkeys(variants, 0.0)
        latencies: dict[str, list[float]] = {name: [] for name in variants}
        for one in variants.values():
            for _ in range(args.warmup):
                assert await one() == EXPECTED
        per_round = max(1, args.runs // args.rounds)
        for _ in range(args.rounds):
            for name, one in variants.items():
                wall, lat = await _measure(one, runs=per_round, concurrency=args.concurrency)
                walls[name] += wall
                latencies[name] += lat
        metrics = pool.metrics()
    bare = _report("bare", walls["bare"], latencies["bare"])
    boxed = _report("sandbox", walls["sandbox"], latencies["sandbox"])
    print(f"pool     runs={metrics['runs']:.0f} failures={metrics['failures']:.0f}")
    overhead = boxed["p50_ms"] / bare["p50_ms"]
    print(
        f"RESULT overhead_vs_bare={overhead:.2f} runs_per_s={boxed['runs_per_s']:.1f} "
        f"p99_ms={boxed['p99_ms']:.1f}"
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
