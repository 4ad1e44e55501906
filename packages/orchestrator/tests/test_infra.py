"""Infrastructure samples: the Prometheus parser, the sampler's rows, the node lock, failures."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from telescope_orchestrator.record.infra import InfraSampler, node_name, parse_vllm_metrics

ROW_KEYS = {"time", "attempt", "node", "node_id", "source", "target", "metric", "value"}

# The shape of vLLM 0.32's /metrics page (prometheus_client exposition of the metrics defined in
# vllm/v1/metrics/loggers.py: labels model_name and engine, two engines here), written by hand.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/tiny llama {v2}"} 3.0
vllm:num_requests_running{engine="1",model_name="/models/tiny llama {v2}"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 500.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 99.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 2048.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 6.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 3.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 25.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 0.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.5
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 3.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 2.0
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 9.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 4.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 64.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0"} 1.0
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} NaN
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2e+09
"""


def test_parse_vllm_metrics() -> None:
    got = parse_vllm_metrics(VLLM_METRICS)
    assert got == pytest.approx(
        {
            "num_requests_running": 5.0,  # 3 + 2 over engines
            "num_requests_waiting": 1.0,
            "kv_cache_usage_perc": 0.5,  # mean of 0.25 and 0.75
            "num_preemptions_total": 5.0,
            "prompt_tokens_total": 1500.0,  # the _by_source counter is another metric
            "generation_tokens_total": 2048.0,
            "prefix_cache_hits_total": 200.0,
            "prefix_cache_queries_total": 800.0,
            "request_success_total": 16.0,  # over finish reasons
            "time_to_first_token_seconds_mean": 0.5,  # (2 + 3) / (4 + 6)
            "e2e_request_latency_seconds_mean": 2.5,
            "request_prefill_time_seconds_mean": 0.25,
            "request_decode_time_seconds_mean": 1.5,
            "inter_token_latency_seconds_mean": 0.02,  # not the per-request TPOT histogram
            "iteration_tokens_total_mean": 16.0,
        }
    )
    assert "request_queue_time_seconds_mean" not in got  # count 0: no mean


def test_parse_older_vllm_names_and_junk() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="a \\"q\\" }"} 0.4\n'
        "vllm:time_per_output_token_seconds_sum 3\n"
        "vllm:time_per_output_token_seconds_count 6\n"
        "vllm:num_requests_running{broken 1\n"
        "vllm:num_requests_waiting not-a-number\n"
        "vllm:num_requests_waiting 2 1700000000000\n"
        "\n"
    )
    assert parse_vllm_metrics(text) == {
        "kv_cache_usage_perc": 0.4,
        "inter_token_latency_seconds_mean": 0.5,
        "num_requests_waiting": 2.0,
    }
    assert parse_vllm_metrics("") == {}


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = VLLM_METRICS.encode() if self.path == "/metrics" else b"no"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_urls() -> Iterator[list[str]]:
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def _by(rows: list[dict[str, Any]], source: str) -> dict[tuple[str, str], float]:
    return {(r["target"], r["metric"]): r["value"] for r in rows if r["source"] == source}


def test_rows_have_the_record_shape(tmp_path: Path) -> None:
    sampler = InfraSampler(lambda rows: None, node="n1", attempt=2, lock_path=tmp_path / "infra.lock")
    sampler.start()
    try:
        rows = sampler.tick()
    finally:
        sampler.stop()
    assert rows
    for row in rows:
        assert set(row) == ROW_KEYS
        assert (row["node"], row["node_id"], row["attempt"]) == ("n1", "", 2)  # outside Ray: no node id
        assert isinstance(row["value"], float)
        assert isinstance(row["time"], float)
    assert len({r["time"] for r in rows}) == 1
    system = _by(rows, "system")
    cores = os.cpu_count() or 1
    assert {f"cpu_core_{i}_utilization_percent" for i in range(cores)} <= {m for _, m in system}
    for metric in (
        "cpu_utilization_percent",
        "system_memory_used_gb",
        "system_memory_available_gb",
        "system_memory_percent",
    ):
        assert ("", metric) in system
    assert 0 < system[("", "system_memory_available_gb")] < 1e5
    assert not _by(rows, "gpu")  # no NVML here
    assert node_name()


def test_ticks_at_once_all_hold_the_node_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick from outside while the thread ticks: both sample the node (they once raced for the
    lock, and the loser returned no rows). A slow ``flock`` widens the window the race needs."""
    import fcntl

    from telescope_orchestrator.record import infra as _infra

    def slow_flock(fd: int, op: int) -> None:
        time.sleep(0.05)
        fcntl.flock(fd, op)

    monkeypatch.setattr(
        _infra, "fcntl", SimpleNamespace(flock=slow_flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    )
    sampler = InfraSampler(lambda rows: None, node="n", lock_path=tmp_path / "infra.lock")
    barrier = threading.Barrier(6)
    results: list[set[str]] = []

    def tick() -> None:
        barrier.wait()
        results.append({r["source"] for r in sampler.tick()})

    threads = [threading.Thread(target=tick) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampler.stop()
    assert results == [{"system"}] * 6


def test_process_rows_sum_the_vllm_tree_and_skip_gone_processes() -> None:
    tree = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time; "
            "c=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
            "print(c.pid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tree.stdout is not None
        tree.stdout.readline()  # the child is up
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        roles = {"driver": os.getpid(), "vllm:http://x": tree.pid, "gone": dead.pid}
        sampler = InfraSampler(lambda rows: None, node="n", pids=lambda: roles, lock_path=None)
        first = _by(sampler.tick(), "process")
        time.sleep(0.05)
        second = _by(sampler.tick(), "process")
    finally:
        tree.kill()
        tree.wait()
        if tree.stdout is not None:
            tree.stdout.close()
    assert ("driver", "cpu_percent") not in first  # psutil needs two looks
    assert {m for t, m in second if t == "driver"} == {"rss_gb", "cpu_percent", "num_threads"}
    assert second[("driver", "num_threads")] >= 1
    assert 0 < second[("driver", "rss_gb")] < 1e3
    assert second[("vllm:http://x", "num_threads")] >= 2  # parent and child, one thread each at least
    assert second[("vllm:http://x", "rss_gb")] > 0
    assert not any(t == "gone" for t, _ in second)


def test_vllm_rows_and_a_server_that_does_not_answer(metrics_urls: list[str]) -> None:
    urls = [*metrics_urls, "http://127.0.0.1:9/"]  # port 9 (discard) refuses
    sampler = InfraSampler(lambda rows: None, node="n", vllm_urls=urls, lock_path=None)
    try:
        with capture_logs() as logs:
            sampler.tick()
            start = time.perf_counter()
            rows = sampler.tick()
            elapsed = time.perf_counter() - start
    finally:
        sampler.stop()
    vllm = _by(rows, "vllm")
    for url in metrics_urls:
        assert vllm[(url, "num_requests_running")] == 5.0
        assert vllm[(url, "time_to_first_token_seconds_mean")] == pytest.approx(0.5)
    assert not any(t.startswith("http://127.0.0.1:9") for t, _ in vllm)
    down = [e for e in logs if e["event"] == "vLLM metrics not answered"]
    assert [e["url"] for e in down] == ["http://127.0.0.1:9"]  # once, not on every tick
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert elapsed < 0.5, f"a tick took {elapsed * 1000:.0f} ms"  # about 10 ms on an idle machine


def test_only_the_lock_holder_samples_the_node(tmp_path: Path) -> None:
    lock = tmp_path / "node" / "infra.lock"
    got: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    a = InfraSampler(
        got["a"].extend, node="n", interval_s=0.05, lock_path=lock, pids=lambda: {"a": os.getpid()}
    )
    b = InfraSampler(
        got["b"].extend, node="n", interval_s=0.05, lock_path=lock, pids=lambda: {"b": os.getpid()}
    )
    with a:
        time.sleep(0.1)
        with b:
            time.sleep(0.3)
        assert got["a"]
        assert got["b"]
        assert {r["source"] for r in got["a"]} >= {"system", "process"}
        assert {r["source"] for r in got["b"]} == {"process"}  # the second sampler of the node
    got["b"].clear()
    with b:  # a released the lock when it stopped
        time.sleep(0.2)
    assert "system" in {r["source"] for r in got["b"]}


def test_the_thread_survives_failures_and_warns_once() -> None:
    calls: list[int] = []

    def sink(rows: list[dict[str, Any]]) -> None:
        calls.append(len(rows))
        raise RuntimeError("sink down")

    def pids() -> dict[str, int]:
        raise OSError("no pids")

    sampler = InfraSampler(sink, node="n", interval_s=0.03, pids=pids, lock_path=None)
    with capture_logs() as logs:
        sampler.start()
        sampler.start()  # idempotent
        time.sleep(0.3)
        sampler.stop()
        sampler.stop()
    warnings = [e["kind"] for e in logs if e["log_level"] == "warning"]
    assert sorted(warnings) == ["process", "sink"]
    assert len(calls) >= 3  # it went on after the sink raised


def test_stop_returns_promptly_with_a_long_interval() -> None:
    sampler = InfraSampler(lambda rows: None, node="n", interval_s=3600.0)
    sampler.start()
    start = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - start < 1.0


class _FakeNvml(SimpleNamespace):
    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        super().__init__()
        self.handles = ["h0", "h1"]

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return self.handles[i]

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=50 if h == "h0" else 0, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(used=2 * 2**30, total=80 * 2**30, free=78 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if h == "h1":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 250_500  # mW

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 61


def test_gpu_rows_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    sampler = InfraSampler(lambda rows: None, node="n", lock_path=None)
    gpu = _by(sampler.tick(), "gpu")
    assert gpu[("0", "gpu_utilization_percent")] == 50.0
    assert gpu[("0", "gpu_memory_used_gb")] == 2.0
    assert gpu[("1", "gpu_memory_total_gb")] == 80.0
    assert gpu[("0", "gpu_power_w")] == 250.5
    assert ("1", "gpu_power_w") not in gpu  # not supported there: left out, the rest kept
    assert gpu[("1", "gpu_temperature_c")] == 61.0


def test_the_other_nodes_processes_are_grouped_by_their_ray_node():
    from telescope_orchestrator.record.observe import remote_pids

    infos = [
        {"setup": {"role": "trainer:0", "node_id": "n-driver"}, "pid": 11},
        {"setup": {"role": "trainer:1", "node_id": "n-b"}, "pid": 12},
        {"setup": {"role": "vllm:http://10.0.0.2:8000", "node_id": "n-b"}, "pid": 13},
        {"setup": {"role": "vllm:http://10.0.0.3:8000", "node_id": "n-c"}, "pid": 14},
        {"setup": {"role": "trainer:2", "node_id": ""}, "pid": 15},  # outside Ray: the driver's host
    ]
    assert remote_pids(infos, "n-driver") == {
        "n-b": {"trainer:1": 12, "vllm:http://10.0.0.2:8000": 13},
        "n-c": {"vllm:http://10.0.0.3:8000": 14},
    }
