"""One rank of the two-rank check of the context-parallel all-gathers (``test_algos_context_parallel.py``).

The full tensor is ``F = arange(8)`` (as ``[8, 3]`` along dim 0 and ``[1, 8]`` along dim 1); rank r
holds its zig-zag piece. Rank 0 writes what both ranks saw to ``OUT.pt``: the gathered tensors and the
gradients of its piece for a loss ``Σ w·gathered`` (replicated: the same w on both ranks; partial:
w = weight_r, different per rank).

    python cp_gather_worker.py OUT.pt      with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from telescope_algos.backend import gather_partial, gather_replicated, zigzag_indices


def _grad(t: torch.Tensor) -> torch.Tensor:
    assert t.grad is not None
    return t.grad


def main() -> None:
    out_path = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, group = dist.get_rank(), dist.group.WORLD
    idx = zigzag_indices(8, 2, rank)
    out: dict = {"idx": idx}
    for name, full, dim in (
        ("rows", torch.arange(24.0).view(8, 3), 0),
        ("cols", torch.arange(8.0).view(1, 8), 1),
    ):
        local = full.index_select(dim, idx).requires_grad_(True)
        weight = torch.arange(1.0, full.numel() + 1).view_as(full)
        gathered = gather_replicated(local, dim, group)
        (gathered * weight).sum().backward()
        out[f"{name}_replicated"] = gathered.detach()
        out[f"{name}_replicated_grad"] = _grad(local).clone()
        local.grad = None
        gathered = gather_partial(local, dim, group)
        (gathered * weight * (10.0**rank)).sum().backward()  # rank 0: w, rank 1: 10·w
        out[f"{name}_partial"] = gathered.detach()
        out[f"{name}_partial_grad"] = _grad(local).clone()
    results = [None, None]
    dist.all_gather_object(results, out)
    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
