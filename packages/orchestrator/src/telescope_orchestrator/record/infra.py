"""Infrastructure samples: CPU, memory, GPUs, the run's processes and vLLM's own metrics.

An :class:`InfraSampler` is a daemon thread that every ``interval_s`` seconds hands a list of rows
to its ``sink``. Every row has the same shape (the ``infra`` record table)::

    {"time": unix s, "attempt": int, "node": str, "node_id": str, "source": str, "target": str,
     "metric": str, "value": float}

``node`` is the host name, ``node_id`` the Ray node id of the sampler's node (empty outside Ray):
several Ray nodes may share a host.

All rows of one tick share ``time``. Sources:

- ``system`` (target ``""``): ``cpu_utilization_percent``, ``cpu_core_{i}_utilization_percent``,
  ``system_memory_used_gb``, ``system_memory_available_gb``, ``system_memory_percent``.
- ``gpu`` (target: the NVML index, every GPU of the node): ``gpu_utilization_percent``,
  ``gpu_memory_used_gb``, ``gpu_memory_total_gb``, ``gpu_power_w``, ``gpu_temperature_c``. Only
  where ``pynvml`` (the ``nvidia-ml-py`` distribution) imports and NVML initialises; otherwise
  there are no GPU rows, and no error. A metric the GPU does not support is left out.
- ``process`` (target: the role from ``pids()``, e.g. ``driver``, ``trainer:0``,
  ``vllm:http://127.0.0.1:8000``): ``rss_gb``, ``cpu_percent``, ``num_threads``. For a role that
  starts with ``vllm`` the values are sums over the process and all its descendants (the API
  server, the engine core and its workers); RSS summed that way counts shared pages twice.
  ``cpu_percent`` is left out the first time a process is seen (psutil measures it between two
  calls). A process that is gone is skipped.
- ``vllm`` (target: the server URL): :func:`parse_vllm_metrics` of ``GET {url}/metrics``.

``system`` and ``gpu`` rows describe the node, so only one sampler per node takes them: the one
holding a non-blocking ``fcntl.flock`` on ``lock_path`` (tried again on every tick, so another
process takes over when the holder stops; with ``lock_path=None`` the sampler always samples).
``lock_path`` must be on a local file system.

Sizes in ``_gb`` are GiB (2**30 bytes). The sampler never raises into its caller: an exception
inside a tick (or in ``sink``) is logged once per kind with ``log.warning`` and the thread goes on.
A server that does not answer within 2 s is skipped for that tick (one debug line when it stops
answering); servers are scraped one after the other, so a hung one delays the tick by up to 2 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

log = structlog.get_logger()

GIB = float(2**30)
SCRAPE_TIMEOUT_S = 2.0

Row = dict[str, Any]
Sink = Callable[[list[Row]], None]

_VLLM_GAUGES_SUM = ("num_requests_running", "num_requests_waiting")
_VLLM_CACHE_GAUGES = ("kv_cache_usage_perc", "gpu_cache_usage_perc")
"""vLLM >= 0.10 calls it kv_cache_usage_perc, older versions gpu_cache_usage_perc."""
_VLLM_COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "num_preemptions_total",
    "request_success_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
)
_VLLM_HISTOGRAMS = (
    "time_to_first_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
    "inter_token_latency_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "iteration_tokens_total",
)
_VLLM_ITL_FALLBACK = "time_per_output_token_seconds"
"""Older vLLM's name for the inter-token latency histogram."""


def _gpu_values(nvml: Any, handle: Any) -> dict[str, float]:
    """The ``gpu`` metrics of one NVML device; one the GPU does not support is left out."""
    readers: dict[str, Callable[[], float]] = {
        "gpu_utilization_percent": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        "gpu_memory_used_gb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
        "gpu_memory_total_gb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / GIB,
        "gpu_power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "gpu_temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
    }
    values: dict[str, float] = {}
    for metric, read in readers.items():
        try:
            values[metric] = float(read())
        except Exception:  # NVML_ERROR_NOT_SUPPORTED and the like
            continue
    return values


def node_name() -> str:
    """This machine's host name."""
    return socket.gethostname()


def _split_labels(rest: str) -> tuple[str, str]:
    """``rest`` starts with ``{``: the label text and what follows the closing brace (quotes and
    backslash escapes inside label values respected)."""
    quoted = escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return rest[1:i], rest[i + 1 :]
    raise ValueError("unclosed label set")


def _samples(text: str) -> Iterator[tuple[str, float]]:
    """``(name, value)`` of every sample line of a Prometheus text exposition (labels dropped,
    lines that do not parse skipped)."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        try:
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                _, rest = _split_labels(line[brace:])
            else:
                name, _, rest = line.partition(" ")
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        yield name, value


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """The metrics the ``vllm`` source reports, from a ``/metrics`` page of vLLM.

    Names lose the ``vllm:`` prefix. Gauges ``num_requests_running`` / ``num_requests_waiting``
    are summed over label sets (engines); ``kv_cache_usage_perc`` (0..1, also read from the older
    ``gpu_cache_usage_perc``) is their mean. Counters (``*_total``) are summed over labels
    (``request_success_total``: over finish reasons). A histogram ``h`` gives ``h_mean`` =
    sum of ``h_sum`` / sum of ``h_count``, left out while the count is 0;
    ``inter_token_latency_seconds_mean`` falls back to ``time_per_output_token_seconds``. NaN
    samples are ignored; a metric the page lacks is left out.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, value in _samples(text):
        if not name.startswith("vllm:") or math.isnan(value):
            continue
        key = name[5:]
        sums[key] = sums.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1
    out = {k: sums[k] for k in _VLLM_GAUGES_SUM + _VLLM_COUNTERS if k in sums}
    for k in _VLLM_CACHE_GAUGES:
        if k in sums:
            out["kv_cache_usage_perc"] = sums[k] / counts[k]
            break
    for h in (*_VLLM_HISTOGRAMS, _VLLM_ITL_FALLBACK):
        total, n = sums.get(f"{h}_sum"), sums.get(f"{h}_count")
        if total is None or not n:
            continue
        key = "inter_token_latency_seconds_mean" if h == _VLLM_ITL_FALLBACK else f"{h}_mean"
        out.setdefault(key, total / n)
    return out


class _NodeLock:
    """A non-blocking ``flock`` on a file, retried until held; ``None`` path: always held."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._fd: int | None = None

    def held(self) -> bool:
        if self._path is None or self._fd is not None:
            return True
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None


class InfraSampler:
    """A daemon thread that calls ``sink(rows)`` every ``interval_s`` (see the module docstring).

    ``pids()`` is called on every tick and maps a role to a pid. ``start`` and ``stop`` are
    idempotent (a stopped sampler may be started again); ``stop`` returns within about 2 s.
    :meth:`tick` takes one sample without the thread (and without the sink).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        node: str,
        node_id: str = "",
        interval_s: float = 5.0,
        pids: Callable[[], dict[str, int]] | None = None,
        vllm_urls: Sequence[str] = (),
        lock_path: Path | None = None,
        attempt: int = 0,
    ) -> None:
        self._sink = sink
        self._node = node
        self._node_id = node_id
        self._interval_s = max(float(interval_s), 0.01)
        self._pids = pids
        self._vllm_urls = tuple(u.rstrip("/") for u in vllm_urls)
        self._attempt = int(attempt)
        self._lock = _NodeLock(lock_path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()
        self._procs: dict[int, Any] = {}
        self._down: set[str] = set()
        self._warned: set[str] = set()
        self._nvml: Any = None
        self._nvml_tried = False
        self._http: Any = None

    def __enter__(self) -> InfraSampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the thread (a second call does nothing)."""
        if self._thread is not None:
            return
        self._guard("system", self._prime_cpu)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="telescope-infra", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most about 2 s); release the node lock."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2.0)
        self._lock.release()
        if self._http is not None:
            with contextlib.suppress(Exception):
                self._http.close()
            self._http = None

    def _run(self, stop: threading.Event) -> None:
        """A sample at once (a short run has one too), then one every ``interval_s``."""
        next_at = time.monotonic()
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = max(next_at + self._interval_s, time.monotonic())
            rows = self.tick()
            if rows and not stop.is_set():
                self._guard("sink", lambda rows=rows: self._sink(rows))

    def tick(self) -> list[Row]:
        """One sample of every source; never raises. Ticks run one at a time: a call from outside
        waits for the thread's tick (both would otherwise race for the node lock, and lose it)."""
        with self._tick_lock:
            now = time.time()
            rows: list[Row] = []
            node_wide = bool(self._guard("lock", self._lock.held))
            if node_wide:
                self._guard("system", lambda: rows.extend(self._system(now)))
                self._guard("gpu", lambda: rows.extend(self._gpus(now)))
            if self._pids is not None:
                self._guard("process", lambda: rows.extend(self._processes(now)))
            for url in self._vllm_urls:
                self._guard("vllm", lambda url=url: rows.extend(self._vllm(now, url)))
            return rows

    def _guard(self, kind: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("infra sampling failed", kind=kind, error=f"{type(exc).__name__}: {exc}")
            return None

    def _row(self, now: float, source: str, target: str, metric: str, value: float) -> Row:
        return {
            "time": now,
            "attempt": self._attempt,
            "node": self._node,
            "node_id": self._node_id,
            "source": source,
            "target": target,
            "metric": metric,
            "value": float(value),
        }

    @staticmethod
    def _prime_cpu() -> None:
        import psutil

        psutil.cpu_percent(interval=None, percpu=True)

    def _system(self, now: float) -> list[Row]:
        import psutil

        cores = psutil.cpu_percent(interval=None, percpu=True)
        mem = psutil.virtual_memory()
        values: dict[str, float] = {
            "cpu_utilization_percent": sum(cores) / len(cores) if cores else 0.0,
            **{f"cpu_core_{i}_utilization_percent": v for i, v in enumerate(cores)},
            "system_memory_used_gb": (mem.total - mem.available) / GIB,
            "system_memory_available_gb": mem.available / GIB,
            "system_memory_percent": mem.percent,
        }
        return [self._row(now, "system", "", k, v) for k, v in values.items()]

    def _processes(self, now: float) -> list[Row]:
        assert self._pids is not None
        roles = self._pids()
        rows: list[Row] = []
        seen: set[int] = set()
        for role, pid in roles.items():
            values = self._process_values(int(pid), tree=role.startswith("vllm"), seen=seen)
            rows.extend(self._row(now, "process", role, k, v) for k, v in values.items())
        for gone in set(self._procs) - seen:
            del self._procs[gone]
        return rows

    def _process(self, pid: int, seen: set[int]) -> tuple[Any, bool]:
        """The cached ``psutil.Process`` of ``pid`` and whether it is new (a reused pid is new)."""
        import psutil

        seen.add(pid)
        proc = self._procs.get(pid)
        if proc is not None and proc.is_running():
            return proc, False
        proc = psutil.Process(pid)
        proc.cpu_percent(interval=None)
        self._procs[pid] = proc
        return proc, True

    def _process_values(self, pid: int, *, tree: bool, seen: set[int]) -> dict[str, float]:
        import psutil

        try:
            root, new = self._process(pid, seen)
            procs = [root, *(root.children(recursive=True) if tree else ())]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return {}
        rss = cpu = threads = 0.0
        for i, proc in enumerate(procs):
            try:
                p, _ = (root, new) if i == 0 else self._process(proc.pid, seen)
                with p.oneshot():
                    rss += p.memory_info().rss
                    threads += p.num_threads()
                    cpu += p.cpu_percent(interval=None)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                if i == 0:
                    return {}
        values = {"rss_gb": rss / GIB, "num_threads": threads}
        if not new:
            values["cpu_percent"] = cpu
        return values

    def _nvml_module(self) -> Any:
        """``pynvml`` initialised, or None (tried once)."""
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                nvml = importlib.import_module("pynvml")
                nvml.nvmlInit()
            except Exception as exc:  # no package, no driver, no GPU: no GPU rows
                log.debug("no NVML: no GPU samples", error=f"{type(exc).__name__}: {exc}")
                return None
            self._nvml = nvml
        return self._nvml

    def _gpus(self, now: float) -> list[Row]:
        nvml = self._nvml_module()
        if nvml is None:
            return []
        rows: list[Row] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            values = _gpu_values(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
            rows.extend(self._row(now, "gpu", str(i), k, v) for k, v in values.items())
        return rows

    def _vllm(self, now: float, url: str) -> list[Row]:
        import httpx

        if self._http is None:
            self._http = httpx.Client(timeout=SCRAPE_TIMEOUT_S)
        try:
            response = self._http.get(f"{url}/metrics")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            if url not in self._down:
                self._down.add(url)
                log.info("vLLM metrics not answered", url=url, error=f"{type(exc).__name__}: {exc}")
            return []
        self._down.discard(url)
        values = parse_vllm_metrics(response.text)
        return [self._row(now, "vllm", url, k, v) for k, v in values.items()]
