"""Helpers of the multi-rank tests: run ``fsdp_worker.py`` on N gloo ranks in N processes (with a
timeout; every rank is killed on failure), and lay out the same micro-batches for one rank."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(job_dir: Path, world: int = 2, timeout_s: float = 420.0) -> list[dict]:
    """Every rank's result (``rank_<r>.pt``) of the job in ``job_dir`` (see ``fsdp_worker.py``)."""
    port = _free_port()
    procs = []
    logs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
        log = (job_dir / f"rank_{rank}.log").open("wb")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(job_dir)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        )
    try:
        for p in procs:
            p.wait(timeout=timeout_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    for rank, p in enumerate(procs):
        if p.returncode != 0:
            text = (job_dir / f"rank_{rank}.log").read_text(errors="replace")[-4000:]
            pytest.fail(f"rank {rank} exited with {p.returncode}:\n{text}")
    return [torch.load(job_dir / f"rank_{r}.pt", weights_only=False) for r in range(world)]


def one_rank_order(by_rank, n):
    """One list whose round-robin groups (``i mod n``) hold what group g held over all ranks.

    Groups can differ in size by more than one (3 micro-batches per rank, n=2: 4 and 2 in all), which
    round-robin dealing on one rank cannot reproduce: shorter groups are topped up with dummy
    micro-batches (no loss tokens), which change nothing.
    """
    blocks = [[mb for mbs in by_rank for mb in mbs[g::n]] for g in range(n)]
    size = max(len(b) for b in blocks)
    dummy = dataclasses.replace(
        blocks[0][0], loss_mask=torch.zeros_like(blocks[0][0].loss_mask), num_samples=0, num_tokens=0
    )
    blocks = [b + [dummy] * (size - len(b)) for b in blocks]
    return [blocks[g][i] for i in range(size) for g in range(n)]
