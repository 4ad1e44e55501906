"""Launch N ranks of a worker script (``megatron_worker.py`` by default) on gloo, with a timeout
(``telescope_algos.testing.run_ranks``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from telescope_algos.testing import free_port
from telescope_algos.testing import run_ranks as spawn

__all__ = ["free_port", "run_ranks"]

WORKER = Path(__file__).with_name("megatron_worker.py")


def run_ranks(
    spec: dict[str, Any], world: int, tmp: Path, *, timeout: float = 600.0, worker: Path = WORKER
) -> dict[str, Any]:
    """Run ``worker`` (default ``megatron_worker.py``) on ``world`` processes; return rank 0's result
    (the file ``spec["out"]``). Kills every rank on failure (``telescope_algos.testing.run_ranks``)."""
    spec = {**spec, "out": str(tmp / "result.pt")}
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    spawn(worker, [str(spec_path)], world=world, log_dir=tmp, timeout_s=timeout, env={"TMPDIR": str(tmp)})
    return torch.load(tmp / "result.pt", weights_only=False)
