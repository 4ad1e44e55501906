"""Launch N ranks of a worker script (``megatron_worker.py`` by default) on gloo, with a timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

WORKER = Path(__file__).with_name("megatron_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    spec: dict[str, Any], world: int, tmp: Path, *, timeout: float = 600.0, worker: Path = WORKER
) -> dict[str, Any]:
    """Run ``worker`` (default ``megatron_worker.py``) on ``world`` processes; return rank 0's result
    (the file ``spec["out"]``). Kills every rank on failure."""
    spec = {**spec, "out": str(tmp / "result.pt")}
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    procs = []
    logs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp),
        }
        log = open(tmp / f"rank{rank}.log", "w")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), str(spec_path)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        )
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for log in logs:
            log.close()
    codes = [p.returncode for p in procs]
    if any(codes):
        tails = "\n".join(
            f"--- rank {r}\n" + (tmp / f"rank{r}.log").read_text()[-3000:] for r in range(world)
        )
        raise AssertionError(f"ranks exited with {codes}\n{tails}")
    return torch.load(tmp / "result.pt", weights_only=False)
