"""Private process groups for weight broadcast: gloo on CPU, NCCL on GPU, one code path.

Rank 0 (the trainer) hosts a ``TCPStore``; every member builds its backend on a ``PrefixStore``
named after the group, so the group is independent of any default ``torch.distributed`` world
the trainer or vLLM already run. Every collective waits with a timeout.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from telescope_weightsync._errors import WeightSyncError

BACKENDS = ("auto", "gloo", "nccl")


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``nccl`` when CUDA is available, else ``gloo``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA; use 'gloo' (or 'auto') on a CPU-only machine")
    return backend


def open_store(host: str, port: int, *, is_master: bool, timeout_s: float, prefix: str) -> dist.PrefixStore:
    """Open (rank 0: host) the rendezvous store and scope it to one group's ``prefix``."""
    store = dist.TCPStore(
        host,
        port,
        is_master=is_master,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        use_libuv=True,
    )
    return dist.PrefixStore(prefix, store)


@dataclass
class Group:
    """One member's handle on a weight-broadcast group (rank 0 sends, the others receive)."""

    pg: dist.ProcessGroup
    backend: str
    rank: int
    world_size: int
    device: torch.device
    timeout_s: float
    name: str

    def broadcast(self, tensor: torch.Tensor, *, what: str) -> None:
        """Broadcast ``tensor`` from rank 0 in place, or raise ``WeightSyncError`` naming ``what``."""
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            try:
                work = self.pg.broadcast(tensor, 0, timeout)
            except TypeError:  # torch builds whose binding lacks the timeout argument
                work = self.pg.broadcast([tensor], dist.BroadcastOptions())
            work.wait(timeout)
        except Exception as exc:  # gloo raises RuntimeError/DistBackendError on timeout or a dead peer
            raise WeightSyncError(
                f"group {self.name!r} rank {self.rank}/{self.world_size}: broadcast of {what} failed "
                f"(timeout {self.timeout_s:.0f}s): {exc}"
            ) from exc

    def close(self) -> None:
        """Release the backend's sockets/communicators (idempotent, never raises)."""
        pg, self.pg = self.pg, None  # type: ignore[assignment]
        if pg is None:
            return
        try:
            if self.backend == "nccl":
                pg.abort()
            else:
                pg.shutdown()
        except Exception:
            pass


def make_group(
    store: dist.Store,
    *,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
    name: str,
    iface_host: str | None = None,
    device: torch.device | None = None,
) -> Group:
    """Build this member's backend on ``store`` and check the group with a one-element broadcast.

    ``iface_host`` pins gloo's sockets to an address (``127.0.0.1`` for the single-node loopback
    bootstrap); ``None`` lets gloo pick the host's default interface.
    """
    backend = resolve_backend(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [
            dist.ProcessGroupGloo.create_device(hostname=iface_host)
            if iface_host
            else dist.ProcessGroupGloo.create_default_device()
        ]
        pg = dist.ProcessGroupGloo(store, rank, world_size, opts)
        device = torch.device("cpu")
    else:
        if device is None or device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    group = Group(pg, backend, rank, world_size, device, timeout_s, name)
    probe = torch.tensor([world_size], dtype=torch.int64, device=device)
    group.broadcast(probe, what="the join probe")
    if backend == "nccl":
        torch.cuda.synchronize(device)
    if int(probe.item()) != world_size:
        group.close()
        raise WeightSyncError(
            f"group {name!r}: members disagree on the world size ({int(probe.item())} != {world_size})"
        )
    return group
