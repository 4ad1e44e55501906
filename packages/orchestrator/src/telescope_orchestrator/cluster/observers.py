"""Infrastructure sampling on the nodes of a run other than the driver's.

The driver's own sampler (``record.infra.InfraSampler``) sees only its node: psutil is local. For
every other Ray node that holds a process of the run, a :class:`NodeObserver` actor (no CPU of its
own) is pinned to that node and runs a sampler there over the run's processes on it (its system,
GPUs and those processes), keeping the rows until the driver drains them. :class:`RemoteInfra` is
the driver's side: it places the observers (``record.observe.remote_pids`` says which node holds
which process), drains them every interval into the run's ``infra`` table, and stops them with the run.
A process restarted on another node (a server or trainer rank placed again) is not followed there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import ray
import structlog

__all__ = ["NodeObserver", "RemoteInfra"]

log = structlog.get_logger()

MAX_KEPT_ROWS = 200_000
"""Rows an observer keeps between drains (the oldest go first when a driver stops draining)."""


@ray.remote(num_cpus=0, max_restarts=0)
class NodeObserver:
    """A sampler of one node's system, GPUs and the run's processes on it; the driver drains it."""

    def __init__(self, pids: dict[str, int], interval_s: float, attempt: int) -> None:
        from telescope_orchestrator.record.infra import InfraSampler, node_name
        from telescope_orchestrator.record.setup import ray_node_id

        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._pids = dict(pids)
        self._sampler = InfraSampler(
            self._keep,
            node=node_name(),
            node_id=ray_node_id(),
            interval_s=interval_s,
            pids=lambda: dict(self._pids),
            attempt=attempt,
        )
        self._sampler.start()

    def _keep(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self._rows.extend(rows)
            del self._rows[:-MAX_KEPT_ROWS]

    def drain(self) -> list[dict[str, Any]]:
        """Every row sampled since the last drain."""
        with self._lock:
            out, self._rows = self._rows, []
        return out

    def stop(self) -> list[dict[str, Any]]:
        """Stop sampling; the rows not drained yet."""
        self._sampler.stop()
        return self.drain()


class RemoteInfra:
    """The driver's side of the observers: one per node of ``pids`` (``{node id: {role: pid}}``),
    drained every ``interval_s`` into ``sink`` by a daemon thread; :meth:`stop` drains them a last
    time and kills them. Never raises into the run: a node that does not answer is skipped."""

    def __init__(
        self,
        pids: dict[str, dict[str, int]],
        sink: Callable[[list[dict[str, Any]]], None],
        *,
        interval_s: float,
        attempt: int,
    ) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._sink = sink
        self._interval_s = max(float(interval_s), 0.1)
        self._observers: list[Any] = [
            NodeObserver.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), name=None
            ).remote(roles, interval_s, attempt)
            for node, roles in pids.items()
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telescope-remote-infra", daemon=True)
        self._thread.start()

    def _collect(self, method: str) -> None:
        refs = [getattr(o, method).remote() for o in self._observers]
        for ref in refs:
            try:
                rows = ray.get(ref, timeout=self._interval_s * 2 + 5)
            except Exception as exc:  # a node gone or slow: its rows wait for the next drain
                log.debug("a node's infra rows not drained", error=repr(exc))
                continue
            if rows:
                try:
                    self._sink(rows)
                except Exception as exc:
                    log.warning("remote infra rows not written", error=repr(exc))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._collect("drain")

    def stop(self) -> None:
        """Drain a last time, stop and kill the observers (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self._interval_s * 2 + 10)
        self._collect("stop")
        kill: Any = getattr(ray, "kill")  # noqa: B009 (Ray types it in part)
        for observer in self._observers:
            with contextlib.suppress(Exception):
                kill(observer, no_restart=True)
        self._observers = []
