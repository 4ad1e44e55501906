"""Benchmark of `telescope ui` on a long run: API latency, first render and the server's memory.

A synthetic run in the record format (telescope_ui.testing.synthetic_run; default 1,000 steps x
1,024 samples, 4 model turns each: 10,240,000 rollout events, 8.2M turns, 3.1M tool calls) is
served by the inspector in its own process. After one warm-up call of each, every API route the
pages use is called ``--calls`` times with random steps, groups, samples and timeline windows;
the p95 is over all calls. The first render is Chromium (Debian's, through Playwright) opening the
runs page, then the metrics page of the run, until each says it is ready. The server's RSS is read
from /proc after the calls.

Baseline, in the same run: the same per-step questions asked the obvious way, through
``telescope_records.connect`` (one DuckDB view per table over the glob of all its files, filtered
by step), which is how a notebook would ask them.

    hatch run python tools/bench_ui.py [--steps 1000 --samples 1024 --turns 4] [--keep DIR]

Prints ``RESULT p95_vs_glob=... p95_ms=... first_render_ms=... rss_mb=...`` last.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def _write_part(args: tuple[str, int, int, int, int, int, float]) -> None:
    path, first, last, samples, turns, steps, started = args
    from telescope_ui import testing

    part = (first, last)
    testing.synthetic_run(path, steps=steps, samples=samples, turns=turns, started=started, step_range=part)


def build(run: Path, steps: int, samples: int, turns: int) -> float:
    """Write the synthetic run with every core; returns the seconds it took."""
    t0 = time.perf_counter()
    workers = max(1, os.cpu_count() or 1)
    started = time.time() - steps * 10.0 - 60  # synthetic steps last 10 s
    chunks = [(1 + i * steps // 50, (i + 1) * steps // 50) for i in range(50)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_write_part, [(str(run), a, b, samples, turns, steps, started) for a, b in chunks if a <= b])
    from telescope_ui import testing

    testing.synthetic_run(run, steps=steps, samples=samples, turns=turns, started=started, step_range=(0, 0))
    return time.perf_counter() - t0


def serve(root: Path) -> tuple[subprocess.Popen[str], str]:
    code = "import sys; from telescope_ui import serve; serve([sys.argv[1]], port=0)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = re.search(r"http://\S+/", proc.stdout.readline())
    assert url, "the inspector did not print its URL"
    return proc, url.group(0)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def calls(
    rng: random.Random, steps: int, samples: int, span: tuple[float, float]
) -> list[tuple[str, dict[str, Any]]]:
    """One call of every route the pages use, with random arguments."""
    step = rng.randint(1, steps)
    groups = samples // 4
    group = step * groups + rng.randrange(groups)
    sample = step * samples + rng.randrange(samples)
    lo, hi = span
    at = rng.uniform(lo, hi - 60)
    return [
        ("runs", {}), ("overview", {"run": "long"}), ("metrics", {"run": "long"}), ("steps", {"run": "long"}),
        ("discarded", {"run": "long"}), ("evals", {"run": "long"}), ("logs", {"run": "long"}),
        ("groups", {"run": "long", "step": step}), ("groups", {"run": "long", "step": step, "kept": "false"}),
        ("samples", {"run": "long", "step": step, "group": group}),
        ("samples", {"run": "long", "step": step, "q": "answer is 7"}),
        ("sample", {"run": "long", "step": step, "id": sample}),
        ("timeline", {"run": "long"}), ("timeline", {"run": "long", "start": at, "end": at + 60}),
        ("infra", {"run": "long"}), ("eval_items", {"run": "long", "step": steps}),
    ]  # fmt: skip


def api_latencies(url: str, steps: int, samples: int, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    rng = random.Random(0)
    with httpx.Client(base_url=url, timeout=120) as client:
        span = client.get("/api/timeline", params={"run": "long", "start": 0, "end": 1}).json()
        window = (span["run_start"], span["run_end"])
        for route, params in calls(rng, steps, samples, window):  # warm-up
            client.get(f"/api/{route}", params=params).raise_for_status()
        for _ in range(n):
            for route, params in calls(rng, steps, samples, window):
                t0 = time.perf_counter()
                client.get(f"/api/{route}", params=params).raise_for_status()
                key = (
                    route + ("(window)" if "start" in params else "") + ("(search)" if "q" in params else "")
                )
                out.setdefault(key, []).append(1000 * (time.perf_counter() - t0))
    return out


def glob_latencies(root: Path, steps: int, samples: int, n: int) -> list[float]:
    """The per-step questions through DuckDB views over every file of each table."""
    import telescope_records as tr

    con = tr.connect(root / "long")
    rng = random.Random(0)
    out = []
    queries = [
        "select group_id, avg(reward) from samples where step = $step and status = 'kept' group by 1",
        "select * from samples where step = $step and group_id = $group",
        "select * from samples where step = $step and sample_id = $sample",
        "select * from turns where step = $step and sample_id = $sample and source = 'train'",
    ]
    for i in range(n + 1):
        step = rng.randint(1, steps)
        params = {"step": step, "group": step * (samples // 4), "sample": step * samples}
        for sql in queries:
            t0 = time.perf_counter()
            con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql}).fetchall()
            if i:  # the first round warms up
                out.append(1000 * (time.perf_counter() - t0))
    return out


def first_render(url: str) -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    from telescope_ui.testing import chromium_path

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = browser.new_page()
        times = []
        for target, name in ((url, "runs"), (f"{url}#/r/long/metrics", "metrics")):
            t0 = time.perf_counter()
            page.goto(target)
            page.wait_for_function(f"() => document.body.dataset.ready === '{name}'", timeout=60_000)
            times.append(1000 * (time.perf_counter() - t0))
            page.goto("about:blank")
        browser.close()
    return times[0], times[1]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--keep", type=Path, default=None, help="write (or reuse) the run under this folder")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    run = root / "long"
    if not (run / "metrics.jsonl").exists():
        build_s = build(run, a.steps, a.samples, a.turns)
        print(f"wrote the run in {build_s:.0f} s")
    size = sum(f.stat().st_size for f in run.rglob("*.parquet")) / 2**20
    events = a.steps * a.samples * (2 * a.turns + 2)
    print(f"run: {a.steps} steps x {a.samples} samples, {events:,} rollout events, {size:.0f} MiB of Parquet")
    proc, url = serve(root)
    try:
        lat = api_latencies(url, a.steps, a.samples, a.calls)
        rss = rss_mb(proc.pid)
        runs_ms, metrics_ms = first_render(url)
    finally:
        proc.terminate()
        proc.wait()
    for route, values in sorted(lat.items()):
        print(f"  {route:22s} median {statistics.median(values):7.1f} ms  p95 {p95(values):7.1f} ms")
    everything = [v for values in lat.values() for v in values]
    per_step = [v for k in ("groups", "samples", "sample") for v in lat[k]]
    glob = glob_latencies(root, a.steps, a.samples, max(3, a.calls // 4))
    print(f"per-step routes p95 {p95(per_step):.1f} ms; the same through glob views p95 {p95(glob):.1f} ms")
    print(
        f"first render: runs page {runs_ms:.0f} ms, metrics page {metrics_ms:.0f} ms; server RSS {rss:.0f} MB"
    )
    if a.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"RESULT p95_vs_glob={p95(per_step) / p95(glob):.3f} p95_ms={p95(everything):.1f} "
        f"first_render_ms={max(runs_ms, metrics_ms):.0f} rss_mb={rss:.0f}"
    )


if __name__ == "__main__":
    main()
