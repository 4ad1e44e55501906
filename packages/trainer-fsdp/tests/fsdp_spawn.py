"""Helpers of the multi-rank tests: run ``fsdp_worker.py`` on N gloo ranks in N processes
(``telescope_algos.testing.run_ranks``), and lay out the same micro-batches for one rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from telescope_algos.testing import run_ranks as spawn

WORKER = Path(__file__).with_name("fsdp_worker.py")


def run_ranks(job_dir: Path, world: int = 2, timeout_s: float = 420.0) -> list[dict]:
    """Every rank's result (``rank_<r>.pt``) of the job in ``job_dir`` (see ``fsdp_worker.py``)."""
    spawn(WORKER, [str(job_dir)], world=world, log_dir=job_dir, timeout_s=timeout_s)
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
