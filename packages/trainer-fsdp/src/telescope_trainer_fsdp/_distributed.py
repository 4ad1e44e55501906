"""torch.distributed set-up for the trainer: one process per rank, gloo on CPU, NCCL on GPU.

If the caller (Ray actor, torchrun, a test) has already initialised the default process group it is
used as is. Otherwise it is initialised from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; with none of them set, a single-process group on a free loopback port.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Protocol, cast

import structlog
import torch
import torch.distributed as dist

__all__ = ["Collectives", "DistInfo", "collectives", "init_distributed"]

_log = structlog.get_logger()


class Collectives(Protocol):
    """The ``torch.distributed`` calls the trainer makes, typed (torch leaves some parameters unannotated)."""

    def new_group(self, ranks: list[int]) -> dist.ProcessGroup | int | None: ...

    def all_reduce(self, tensor: torch.Tensor) -> None: ...

    def barrier(self) -> None: ...


collectives = cast(Collectives, dist)
"""``torch.distributed`` itself, seen through ``Collectives``."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: its rank, the world, its device, and whether we own the group."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(*, device: str | torch.device | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Join (or create) the default process group and pick this rank's device.

    Args:
        device: force a device (``"cpu"``, ``"cuda"``); default CUDA when available, else CPU.
        timeout_s: collective timeout of a process group created here (a hung peer fails, not hangs).
    """
    if device is None:
        dev_type = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        dev_type = torch.device(device).type
    if dev_type not in ("cpu", "cuda"):
        raise ValueError(f"the FSDP trainer runs on cpu or cuda, got device {device!r}")
    owns = False
    if not dist.is_initialized():
        env = os.environ
        keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        present = [k for k in keys if k in env]
        if present and len(present) != len(keys):
            missing = ", ".join(k for k in keys if k not in env)
            raise RuntimeError(
                f"torch.distributed environment incomplete: {missing} unset. Set all of RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT (or none of them for a single process)."
            )
        if present:
            init_method = "env://"
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        else:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            rank, world = 0, 1
        backend = "nccl" if dev_type == "cuda" else "gloo"
        device_id: torch.device | None = None  # init_process_group's default
        if dev_type == "cuda":
            local = int(env.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
            torch.cuda.set_device(local)
            device_id = torch.device("cuda", local)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device_id,
        )
        owns = True
        _log.debug("process group initialised", backend=backend, rank=rank, world_size=world)
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        dev = torch.device("cpu")
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, owns_group=owns)
