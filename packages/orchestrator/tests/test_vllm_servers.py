"""The vLLM launcher (telescope_orchestrator.cluster.vllm_server): command lines, settings from the
config, classified start-up failures, and stopping; server processes are stand-in Python processes here (the
real vLLM servers are in tests/test_rollout_vllm.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telescope_orchestrator.cluster.vllm_server import (
    ServerDiedError,
    ServerHandle,
    ServerSettings,
    ServerStartError,
    classify_failure,
    launch_server,
    server_command,
    server_env,
    vllm_lora_rank,
)


def _config():
    from telescope_config import TelescopeConfig, defaults

    return TelescopeConfig.model_validate({**defaults(), "environments": [{"name": "countdown"}]})


def test_server_command_carries_the_config_options():
    s = ServerSettings(
        model="/m", base_port=9000, gpu_memory_utilization=0.5, max_model_len=512, max_num_seqs=4,
        max_num_batched_tokens=1024, tensor_parallel_size=2, scheduling_policy="fcfs",
    )  # fmt: skip
    cmd = server_command(s, 9001, extension_cls="pkg.Ext", python="py")
    line = " ".join(cmd)
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    for part in [
        "--model /m", "--port 9001", "--max-model-len 512", "--tensor-parallel-size 2",
        "--gpu-memory-utilization 0.5", "--max-num-seqs 4", "--max-num-batched-tokens 1024",
        "--scheduling-policy fcfs", "--worker-extension-cls pkg.Ext", "--enable-prefix-caching",
        "--dtype auto", "--logprobs-mode processed_logprobs", "--enable-per-request-metrics",
    ]:  # fmt: skip
        assert part in line
    assert "--enforce-eager" not in cmd
    assert "--disable-uvicorn-access-log" in cmd
    assert "--disable-uvicorn-access-log" not in server_command(
        ServerSettings(model="/m", access_log=True), 1
    )
    cpu = server_command(ServerSettings(model="/m", device="cpu"), 1)
    assert cpu[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in cpu
    # one tensor-parallel rank on pinned cores: the model in the engine process, forked (vllm_main)
    pinned = server_command(ServerSettings(model="/m", device="cpu"), 1, pinned_cores=1)
    assert pinned[1:3] == ["-m", "telescope_orchestrator.cluster.vllm_main"]
    assert [a for a in pinned[3:] if a not in ("--distributed-executor-backend", "uni")] == cpu[3:]
    assert cpu[cpu.index("--dtype") + 1] == "float32"
    assert "--gpu-memory-utilization" not in cpu


def test_a_pinned_cpu_server_of_one_rank_runs_its_model_in_the_engine_process():
    cpu = ServerSettings(model="/m", device="cpu")
    cmd = server_command(cpu, 1, pinned_cores=2)
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    env = server_env(cpu, extension_cls=None, pinned_cores=2)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2"}
    # unpinned, tensor parallel or on a GPU: vLLM's own executor and thread settings
    for settings, pinned in ((cpu, 0), (ServerSettings(model="/m", device="cpu", tensor_parallel_size=2), 2),
                             (ServerSettings(model="/m"), 2)):  # fmt: skip
        assert "--distributed-executor-backend" not in server_command(settings, 1, pinned_cores=pinned)
        assert server_env(settings, extension_cls=None, pinned_cores=pinned) == {}


def test_a_lora_run_serves_one_adapter_of_the_smallest_rank_vllm_accepts():
    assert "--enable-lora" not in server_command(ServerSettings(model="/m"), 1)
    assert server_env(ServerSettings(model="/m"), extension_cls=None) == {}
    cfg = _config().model_copy(update={"lora_rank": 12})
    settings = ServerSettings.from_config(cfg)
    assert settings.lora_rank == 12  # from the run's config
    cmd = server_command(settings, 1)
    assert "--enable-lora" in cmd
    assert cmd[cmd.index("--max-loras") + 1] == "1"
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16"  # vLLM takes 1, 8, 16, 32, ...: 16 holds 12
    env = server_env(settings, extension_cls="pkg.Ext")
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    # rank -> --max-lora-rank, by hand from vLLM's list
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 65, 300, 320, 512)] == [
        1,
        8,
        8,
        16,
        64,
        128,
        320,
        320,
        512,
    ]
    with pytest.raises(ValueError, match="512"):
        vllm_lora_rank(513)


def test_prefix_caching_is_on_by_default_and_off_when_asked():
    on = server_command(ServerSettings(model="/m"), 1)
    off = server_command(ServerSettings(model="/m", enable_prefix_caching=False), 1)
    assert "--enable-prefix-caching" in on
    assert "--no-enable-prefix-caching" not in on
    assert "--no-enable-prefix-caching" in off
    assert "--enable-prefix-caching" not in off
    # the run's config decides: a config with it off starts servers without prefix caching
    cfg = _config().model_copy(update={"enable_prefix_caching": False})
    assert ServerSettings.from_config(cfg).enable_prefix_caching is False
    assert "--no-enable-prefix-caching" in server_command(ServerSettings.from_config(cfg), 1)


def test_a_cpu_server_with_prefix_caching_uses_blocks_a_short_prompt_fills():
    cpu = server_command(ServerSettings(model="/m", device="cpu"), 1)
    assert cpu[cpu.index("--block-size") + 1] == "32"
    # vLLM's own default elsewhere: on GPU, without prefix caching, or when the user gives one
    assert "--block-size" not in server_command(ServerSettings(model="/m"), 1)
    no_cache = ServerSettings(model="/m", device="cpu", enable_prefix_caching=False)
    assert "--block-size" not in server_command(no_cache, 1)
    own = server_command(ServerSettings(model="/m", device="cpu", extra_args=("--block-size", "64")), 1)
    assert own.count("--block-size") == 1
    assert own[own.index("--block-size") + 1] == "64"


def test_server_settings_from_config():
    cfg = _config()
    s = ServerSettings.from_config(cfg, device="cpu")
    assert (s.model, s.base_port, s.max_model_len) == (cfg.model, cfg.inference_base_port, cfg.max_model_len)
    assert s.tensor_parallel_size == cfg.inference_tensor_parallel_size
    assert (s.host, s.scheduling_policy, s.seed) == (cfg.inference_host, cfg.vllm_scheduling_policy, cfg.seed)
    assert s.device == "cpu"


def test_every_server_setting_is_a_config_field_with_the_packaged_default():
    from telescope_rollout.engine import config_mismatches

    assert config_mismatches(ServerSettings) == []


def test_from_config_names_a_missing_field():
    cfg = _config()

    class WithoutHost:
        def __getattr__(self, name: str) -> Any:
            if name == "inference_host":
                raise AttributeError(name)
            return getattr(cfg, name)

    with pytest.raises(AttributeError, match=r"no field 'inference_host' \(for ServerSettings\.host\)"):
        ServerSettings.from_config(WithoutHost())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("log", "kind", "fix"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
            "out of memory",
            "gpu_memory_utilization",
        ),
        ("OSError: /x does not appear to have a file named config.json", "model not found", "model"),
        (
            "RuntimeError: The NVIDIA driver on your system is too old",
            "CUDA mismatch",
            "compatibility matrix",
        ),
        ("OSError: [Errno 98] Address already in use", "port in use", "inference_base_port"),
    ],
)
def test_failures_are_classified_with_their_fix(log, kind, fix):
    found = classify_failure(f"INFO starting\n{log}\n")
    assert found is not None
    assert found[0] == kind
    assert fix in found[1]
    assert classify_failure("INFO all good") is None


def test_busy_port_is_reported_before_launch(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        settings = ServerSettings(model="/m", base_port=port)
        with pytest.raises(ServerStartError, match=rf"port {port} .*inference_base_port") as info:
            launch_server(settings, port=port, log_path=tmp_path / "vllm_0.log")
    assert info.value.kind == "port in use"
    assert not list(tmp_path.iterdir())  # nothing was launched


def test_missing_model_folder_is_reported_before_launch(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once the block ends
    settings = ServerSettings(model=str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ServerStartError, match=r"does not exist\. Fix: ensure the `model` path") as info:
        launch_server(settings, port=port, log_path=tmp_path / "logs" / "vllm_0.log")
    assert info.value.kind == "model not found"
    assert not (tmp_path / "logs").exists()


def test_exit_during_startup_is_classified(tmp_path: Path):
    log = tmp_path / "vllm_0.log"
    with log.open("wb") as fh:
        code = "print('torch.OutOfMemoryError: CUDA out of memory'); raise SystemExit(1)"
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    handle = ServerHandle(0, 1, "http://127.0.0.1:1", proc, log)
    with pytest.raises(
        ServerStartError, match=r"exited with code 1 \(out of memory\)\. Fix: .*gpu_memory_utilization"
    ):
        handle.wait_healthy(timeout_s=30, poll_s=0.1)


# ---------------------------------------------------------------- stopping and deaths, with fake processes
def _fake_handle(index: int, port: int, log_path: Path) -> ServerHandle:
    """A stand-in server: a sleeping Python process in its own session (stop() kills the group)."""
    with log_path.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return ServerHandle(index, port, f"http://127.0.0.1:{port}", proc, log_path)


def test_a_dead_server_is_reported_with_its_classified_log(tmp_path):
    with _fake_handle(0, 9100, tmp_path / "vllm_0.log") as handle:
        handle.check()  # alive: nothing to report
        handle.log_path.write_text("torch.OutOfMemoryError: CUDA out of memory\n")
        os.killpg(handle.process.pid, signal.SIGKILL)
        handle.process.wait(timeout=30)
        died = r"server 0 .* died: it was killed by SIGKILL \(out of memory\)"
        with pytest.raises(ServerDiedError, match=died):
            handle.check()


def test_stop_ends_every_server_process(tmp_path):
    handles = [_fake_handle(i, 9100 + i, tmp_path / f"vllm_{i}.log") for i in range(2)]
    with handles[0]:
        pass  # leaving the block stops it
    handles[1].stop(timeout_s=10)
    assert [h.process.poll() for h in handles] == [-signal.SIGTERM, -signal.SIGTERM]
    handles[1].stop(timeout_s=10)  # idempotent


def test_free_port_run_is_free_and_below_the_ephemeral_range():
    from telescope_orchestrator.cluster.vllm_server import free_port_run, port_in_use

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    port = free_port_run(span=4)
    assert port >= 20000
    assert port + 4 <= min(low, 32768)
    assert not any(port_in_use("0.0.0.0", p) for p in range(port, port + 4))


def test_a_host_whose_ephemeral_range_starts_low_still_gets_a_free_run(monkeypatch):
    from telescope_orchestrator.cluster import vllm_server

    monkeypatch.setattr(vllm_server, "_ephemeral_start", lambda: 1024)  # net.ipv4.ip_local_port_range
    port = vllm_server.free_port_run(span=4)
    assert not any(vllm_server.port_in_use("0.0.0.0", p) for p in range(port, port + 4))
    assert 0 < vllm_server.free_port() < 65536


def test_stop_kills_what_is_left_of_the_group_when_the_server_itself_exited(tmp_path):
    """A forked engine core outlives its API server with the listening socket: stop() ends it too."""
    import time

    from telescope_orchestrator.cluster.vllm_server import ServerHandle

    pid_file = tmp_path / "child.pid"
    leader = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 0"], start_new_session=True
    )
    leader.wait(timeout=10)
    child = int(pid_file.read_text())
    os.kill(child, 0)  # alive after its leader exited
    ServerHandle(0, 1, "http://x", leader, tmp_path / "log", [], {}).stop(timeout_s=5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail("the group's remaining process outlived stop()")
