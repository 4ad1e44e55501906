"""What the driver records about the run once it is up: the setup of every process, the model,
the environments (``setup``, ``model``, ``environments`` tables, once per attempt), and the
infrastructure sampler that writes ``infra`` every few seconds until the run stops.

Nothing here may stop a run: a failure is logged as a warning and the record goes without it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from telescope_orchestrator.record.rundir import RunDir

__all__ = ["environment_rows", "local_pids", "record_setup", "remote_pids", "start_infra"]

log = structlog.get_logger()


def _environment_row(role: str, name: str, env: Any) -> dict[str, Any]:
    try:
        size = len(env)
    except TypeError:
        size = None
    return {
        "role": role,
        "name": name,
        "class_name": type(env).__name__,
        "multi_turn": bool(getattr(env, "is_multi_turn", False)),
        "dataset_size": size,
        "max_turns": getattr(env, "max_turns", -1) if getattr(env, "is_multi_turn", False) else -1,
        "reward_min": getattr(env, "reward_min", None),
        "reward_max": getattr(env, "reward_max", None),
        "metrics_ranges": dict(getattr(env, "metrics_ranges", {}) or {}),
        "tags_options": dict(getattr(env, "tags_options", {}) or {}),
    }


def environment_rows(built: Iterable[Any], evals: Any) -> list[dict[str, Any]]:
    """Rows of ``environments``: the training environments (``built``), then the evals."""
    rows = [_environment_row("train", b.name, b.env) for b in built]
    if evals is not None:
        rows += [_environment_row("eval", n, env) for n, env in evals.environments.items()]
    return rows


def record_setup(
    run: RunDir,
    model: str,
    *,
    infos: Sequence[dict[str, Any]],
    built: Iterable[Any],
    evals: Any,
) -> dict[str, int]:
    """Write ``setup``, ``model`` and ``environments`` for this attempt from the workers'
    ``infos`` (``cluster.calls.setup_infos``); returns role -> pid of every process of the run
    (for :func:`start_infra`)."""
    from telescope_orchestrator.record.setup import process_setup

    records = run.records
    setup = [process_setup("driver")] + [i["setup"] for i in infos if "setup" in i]
    records.write_once("setup", setup)
    models = [{**i["model"], "model": model} for i in infos if "model" in i]
    records.write_once("model", models)
    records.write_once("environments", environment_rows(built, evals))
    return {"driver": os.getpid(), **_on_this_node(infos)}


def local_pids(infos: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Role -> pid of the workers of ``infos`` (workers placed again) on this node."""
    return _on_this_node(infos)


def _on_this_node(infos: Iterable[dict[str, Any]]) -> dict[str, int]:
    """The driver samples the processes of its own node (psutil is local); ``cluster.observers``
    samples the others (:func:`remote_pids`)."""
    from telescope_orchestrator.record.setup import ray_node_id

    return _by_node(infos, ray_node_id())[0]


def remote_pids(infos: Iterable[dict[str, Any]], driver_node: str) -> dict[str, dict[str, int]]:
    """``{Ray node id: {role: pid}}`` of the workers of ``infos`` on nodes other than the driver's
    (``driver_node``), which :func:`local_pids` leaves out."""
    return _by_node(infos, driver_node)[1]


def _by_node(
    infos: Iterable[dict[str, Any]], driver_node: str
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The workers of ``infos`` on the driver's node (role -> pid) and on each other Ray node. A
    worker is on the driver's node when both name the same Ray node (several may share a host), or,
    where either names none, when it runs on the driver's host."""
    here = socket.gethostname()
    local: dict[str, int] = {}
    others: dict[str, dict[str, int]] = {}
    for info in infos:
        setup, pid = info.get("setup", {}), info.get("pid")
        if not pid:
            continue
        role, node = str(setup["role"]), str(setup.get("node_id") or "")
        on_driver = (node == driver_node) if (driver_node and node) else (setup.get("node") == here)
        if on_driver:
            local[role] = int(pid)
        elif node:
            others.setdefault(node, {})[role] = int(pid)
    return local, others


def start_infra(run: RunDir, *, pids: dict[str, int], urls: Sequence[str], interval_s: float) -> Any:
    """Start the driver's infrastructure sampler (its node's system and GPUs, every process of
    the run on it, every server's vLLM metrics) every ``interval_s`` (the config's
    ``system_metrics_collection_interval_seconds``); returns it (``stop()`` at the end) or None."""
    from telescope_orchestrator.record.infra import InfraSampler, node_name
    from telescope_orchestrator.record.setup import ray_node_id

    records = run.records
    try:
        sampler = InfraSampler(
            lambda rows: records.writer.append("infra", rows),
            node=node_name(),
            node_id=ray_node_id(),
            interval_s=interval_s,
            pids=lambda: dict(pids),
            vllm_urls=list(urls),
            attempt=records.attempt,
        )
        sampler.start()
    except Exception as exc:
        log.warning("infrastructure sampling not started", error=repr(exc))
        return None
    return sampler
