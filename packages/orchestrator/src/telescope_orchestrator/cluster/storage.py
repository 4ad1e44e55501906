"""Shared storage, checked before anything is placed: every node of a Ray cluster the run joined
must see the run directory and the checkpoint directory the driver sees.

Trainer ranks write their checkpoint shards, and every actor its logs, into those folders; on a
node without the shared mount a write succeeds on the node's own disk, where no one reads it. So
when the cluster has nodes other than the driver's, the driver writes a marker into each folder
and a task pinned to every node that can hold the run's actors writes its own and reads the
driver's (:func:`probe_nodes`); the driver then looks for every node's markers
(:func:`storage_problem`). A node that misses either way stops the run before any server starts,
with the folder, the node and the fix. A local Ray (one node, the driver's) is not checked.
docs/troubleshooting.md, "A node cannot see the run directory".
"""

from __future__ import annotations

import contextlib
import importlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

__all__ = ["MARKERS", "NodeReport", "check_shared_storage", "probe_nodes", "storage_problem"]

MARKERS = ".telescope-nodes"
"""The folder of markers inside each checked directory (removed after the check)."""


@dataclass(frozen=True)
class NodeReport:
    """What one node saw: ``node`` (its Ray node id), ``address`` (its IP), and per directory the
    driver's marker seen (True), not seen (False), or the error writing its own (a string)."""

    node: str
    address: str
    seen: dict[str, bool | str]


def _marker(directory: Path, name: str) -> Path:
    return directory / MARKERS / name


def _probe(directories: list[str], driver_marker: str, node: str, address: str) -> NodeReport:
    """Runs on one node: write this node's marker into each directory, look for the driver's."""
    seen: dict[str, bool | str] = {}
    for d in directories:
        try:
            mine = _marker(Path(d), f"{node}.{driver_marker}")
            mine.parent.mkdir(parents=True, exist_ok=True)
            mine.write_text(node, encoding="utf-8")
            seen[d] = _marker(Path(d), driver_marker).is_file()
        except OSError as exc:
            seen[d] = f"{type(exc).__name__}: {exc}"
    return NodeReport(node, address, seen)


def storage_problem(directories: Sequence[Path], token: str, reports: Sequence[NodeReport]) -> str | None:
    """The first node that does not share ``directories`` with the driver, as a message with the fix
    (None: all do). A node shares a directory when it saw the driver's marker ``token`` and the
    driver sees the node's."""
    for report in reports:
        for d in directories:
            seen = report.seen.get(str(d), False)
            if isinstance(seen, str):
                how = f"cannot write into it ({seen})"
            elif not seen:
                how = "does not see the driver's files in it"
            elif not _marker(d, f"{report.node}.{token}").is_file():
                how = "writes into a folder of that name the driver does not see"
            else:
                continue
            return (
                f"Ray node {report.node[:12]} ({report.address}) {how}: {d}. Every node of the run must "
                "see the run directory and the checkpoint directory (the trainer ranks write checkpoints "
                "there, every actor its logs). Mount one shared filesystem at that path on every node "
                "(NFS, a cloud file store), or give --run-dir and --checkpoint_dir paths every node shares."
            )
    return None


def probe_nodes(directories: Sequence[Path], token: str, *, timeout_s: float) -> list[NodeReport]:
    """One pinned task per alive node that can hold actors (it has CPUs), other than the driver's;
    their reports. The driver's marker ``token`` must already be in every directory."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from telescope_orchestrator.cluster.ray_cluster import alive_nodes

    ray: Any = importlib.import_module("ray")
    driver = str(ray.get_runtime_context().get_node_id())
    nodes = [
        n
        for n in alive_nodes()
        if n.get("NodeID") != driver and float(dict(n.get("Resources") or {}).get("CPU", 0)) > 0
    ]
    remote: Any = ray.remote(num_cpus=0, max_retries=0)(_probe)
    refs: list[Any] = [
        remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            [str(d) for d in directories], token, n["NodeID"], n.get("NodeManagerAddress", "?")
        )
        for n in nodes
    ]
    return [cast(NodeReport, r) for r in ray.get(refs, timeout=timeout_s)]


def check_shared_storage(directories: Sequence[Path], *, timeout_s: float = 120.0) -> str | None:
    """Whether every node of the joined cluster shares ``directories`` with the driver: None, or the
    problem (:func:`storage_problem`). The markers are removed afterwards."""
    token = f"driver-{uuid.uuid4().hex}"
    dirs = [Path(d).resolve() for d in directories]
    for d in dirs:
        _marker(d, token).parent.mkdir(parents=True, exist_ok=True)
        _marker(d, token).write_text("driver", encoding="utf-8")
    try:
        reports = probe_nodes(dirs, token, timeout_s=timeout_s)
        return storage_problem(dirs, token, reports)
    finally:
        for d in dirs:
            for path in (d / MARKERS).glob(f"*{token}"):
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                (d / MARKERS).rmdir()
