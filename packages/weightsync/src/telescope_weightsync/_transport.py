"""Private process groups for weight broadcast: gloo on CPU, NCCL on GPU, one code path.

Rank 0 (the trainer) hosts a ``TCPStore``; every member builds its backend on a ``PrefixStore``
named after the group, so the group is independent of any default ``torch.distributed`` world
the trainer or vLLM already run. Every collective waits with a timeout.
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass
from typing import Any, Protocol, cast, overload

import torch

# From the module that declares them: ``torch.distributed`` re-exports these without saying so,
# which a type checker does not accept. (The backends are imported where they are built: a
# CPU-only torch has no NCCL.)
from torch._C._distributed_c10d import BroadcastOptions, PrefixStore, Store, TCPStore, Work

from telescope_weightsync._errors import GroupError

__all__ = ["BACKENDS", "Group", "make_group", "open_store", "resolve_backend"]

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


def open_store(host: str, port: int, *, is_master: bool, timeout_s: float, prefix: str) -> PrefixStore:
    """Open (rank 0: host) the rendezvous store and scope it to one group's ``prefix``."""
    store = TCPStore(
        host,
        port,
        is_master=is_master,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        use_libuv=True,
    )
    return PrefixStore(prefix, store)


class Backend(Protocol):
    """The calls a group makes on its torch backend (``ProcessGroupGloo`` or ``ProcessGroupNCCL``).

    The binding has them all; its type stubs declare ``broadcast`` on ``ProcessGroup`` only.
    """

    @overload
    def broadcast(self, tensor: torch.Tensor, root: int, timeout: datetime.timedelta) -> Work: ...
    @overload
    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions) -> Work: ...
    def shutdown(self) -> None: ...
    def abort(self) -> None: ...


@dataclass
class Group:
    """One member's handle on a weight-broadcast group (rank 0 sends, the others receive)."""

    pg: Backend | None
    backend: str
    rank: int
    world_size: int
    device: torch.device
    timeout_s: float
    name: str

    def broadcast(self, tensor: torch.Tensor, *, what: str) -> None:
        """Broadcast ``tensor`` from rank 0 in place, or raise ``GroupError`` naming ``what``."""
        where = f"group {self.name!r} rank {self.rank}/{self.world_size}"
        if self.pg is None:
            raise GroupError(f"{where}: broadcast of {what} on a closed group")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            try:
                work = self.pg.broadcast(tensor, 0, timeout)
            except TypeError:  # torch builds whose binding lacks the timeout argument
                work = self.pg.broadcast([tensor], BroadcastOptions())
            work.wait(timeout)
        except Exception as exc:  # gloo raises RuntimeError/DistBackendError on timeout or a dead peer
            raise GroupError(
                f"{where}: broadcast of {what} failed (timeout {self.timeout_s:.0f}s): {exc}"
            ) from exc

    def close(self) -> None:
        """Release the backend's sockets/communicators (idempotent, never raises)."""
        pg, self.pg = self.pg, None
        if pg is None:
            return
        with contextlib.suppress(Exception):
            if self.backend == "nccl":
                pg.abort()
            else:
                pg.shutdown()


def _gloo_backend(
    store: Store, rank: int, world_size: int, timeout: datetime.timedelta, iface_host: str | None
) -> Backend:
    from torch._C._distributed_c10d import ProcessGroupGloo

    # The stubs lack the binding's options class (a timeout and the device to bind to) and the
    # constructor that takes it; the device factories' ``lazy_init`` argument is untyped.
    opts = cast(Any, ProcessGroupGloo._Options())  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
    opts._timeout = timeout
    opts._devices = [
        ProcessGroupGloo.create_device(hostname=iface_host)  # pyright: ignore[reportUnknownMemberType]
        if iface_host
        else ProcessGroupGloo.create_default_device()  # pyright: ignore[reportUnknownMemberType]
    ]
    return cast(Backend, ProcessGroupGloo(store, rank, world_size, opts))


def _nccl_backend(store: Store, rank: int, world_size: int, timeout: datetime.timedelta) -> Backend:
    from torch._C._distributed_c10d import ProcessGroupNCCL

    opts = ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return cast(Backend, ProcessGroupNCCL(store, rank, world_size, opts))


def make_group(
    store: Store,
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
        pg = _gloo_backend(store, rank, world_size, timeout, iface_host)
        device = torch.device("cpu")
    else:
        if device is None or device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        pg = _nccl_backend(store, rank, world_size, timeout)
    group = Group(pg, backend, rank, world_size, device, timeout_s, name)
    probe = torch.tensor([world_size], dtype=torch.int64, device=device)
    group.broadcast(probe, what="the join probe")
    if backend == "nccl":
        torch.cuda.synchronize(device)
    if int(probe.item()) != world_size:
        group.close()
        raise GroupError(
            f"group {name!r}: members disagree on the world size ({int(probe.item())} != {world_size})"
        )
    return group
