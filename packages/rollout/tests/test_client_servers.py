"""InferenceClient against an in-process HTTP fake, server command lines and failure messages."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from telescope_rollout import (
    InferenceClient,
    PromptTooLongError,
    ServerSettings,
    ServerStartError,
    ServerTimeoutError,
    ServerUnavailableError,
    classify_failure,
    server_command,
    start_servers,
)
from telescope_rollout._advantage import advantage_fn_for, is_zero_advantage, overlong_penalty
from telescope_rollout._servers import ServerDiedError, ServerGroup, ServerHandle

BODY = {
    "id": "cmpl-1",
    "choices": [
        {
            "index": 0,
            "text": " hi",
            "token_ids": [5, 6],
            "prompt_token_ids": [1, 2, 3],
            "logprobs": {"token_logprobs": [-0.25, None], "tokens": ["a", "b"]},
            "finish_reason": "length",
        }
    ],
}


@contextlib.asynccontextmanager
async def fake_vllm(seen: list[dict], fail_first: int = 0, hang: bool = False) -> AsyncIterator[str]:
    """A real HTTP server in this event loop that answers like vLLM; yields its URL.

    The first ``fail_first`` completion requests get their connection dropped without an answer;
    with ``hang`` every completion request is taken and never answered.
    """
    state = {"n": 0}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        state["n"] += 1
        if state["n"] <= fail_first:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        body = await request.json()
        seen.append(body)
        if hang:
            await asyncio.sleep(3600)
        if len(body["prompt"]) > 10:
            msg = (
                "This model's maximum context length is 10 tokens. However, your request has 12 input tokens."
            )
            return web.json_response({"error": {"message": msg}}, status=400)
        return web.json_response(BODY)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def free_port() -> int:
    """A port nothing listens on now (bound to port 0, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_complete_sends_ids_and_parses_tokens_and_logprobs():
    seen: list[dict] = []
    async with fake_vllm(seen) as url, InferenceClient([url + "/"]) as client:
        c = await client.complete(url, [1, 2, 3], max_tokens=7, sampling={"temperature": 0.5}, priority=-2)
    assert seen[0] == {
        "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 7, "n": 1, "logprobs": 1,
        "return_token_ids": True, "skip_special_tokens": False, "include_stop_str_in_output": False,
        "temperature": 0.5, "priority": -2,
    }  # fmt: skip
    assert (c.text, c.token_ids, c.logprobs, c.finish_reason) == (" hi", [5, 6], [-0.25, 0.0], "length")
    assert c.prompt_token_ids == [1, 2, 3]
    assert c.server == url


async def test_connection_errors_are_retried_then_reported():
    seen: list[dict] = []
    async with fake_vllm(seen, fail_first=2) as url:
        async with InferenceClient([url], model="m", backoff_s=0.0) as c:
            out = await c.complete(url, [1], max_tokens=1)
        assert out.token_ids == [5, 6]
        assert len(seen) == 1  # two dropped connections, then the answer
    dead = f"http://127.0.0.1:{free_port()}"
    async with InferenceClient([dead], model="m", retries=1, backoff_s=0.0) as c:
        assert not await c.healthy(dead)
        with pytest.raises(ServerUnavailableError, match="after 2 attempts") as info:
            await c.complete(dead, [1], max_tokens=1)
    assert info.value.url == dead


async def test_a_server_that_never_answers_times_out_with_its_url():
    seen: list[dict] = []
    async with fake_vllm(seen, hang=True) as url, InferenceClient([url], model="m", timeout_s=0.3) as c:
        with pytest.raises(ServerTimeoutError, match=r"no answer within 0\.3 s") as info:
            await c.complete(url, [1], max_tokens=1)
    assert info.value.url == url
    assert len(seen) == 1  # a timeout is not retried: the request may still be running there


async def test_context_length_error_becomes_prompt_too_long():
    async with fake_vllm([]) as url, InferenceClient([url], model="m") as c:
        with pytest.raises(PromptTooLongError) as info:
            await c.complete(url, list(range(12)), max_tokens=1)
    assert (info.value.prompt_tokens, info.value.max_model_len) == (12, 10)


async def test_many_requests_in_flight_share_the_pool():
    """More requests at once than aiohttp's default pool size (100): all answered, none lost."""
    seen: list[dict] = []
    async with fake_vllm(seen) as url, InferenceClient([url], model="m") as c:
        outs = await asyncio.gather(*(c.complete(url, [i % 7], max_tokens=1) for i in range(300)))
    assert len(outs) == len(seen) == 300
    assert sorted(b["prompt"][0] for b in seen) == sorted(i % 7 for i in range(300))


def test_client_can_be_built_outside_an_event_loop():
    client = InferenceClient(["http://127.0.0.1:1"], timeout_s=5)  # as the CLI does, then `async with`
    assert client.server_urls == ["http://127.0.0.1:1"]
    with pytest.raises(ValueError, match="at least one server URL"):
        InferenceClient([])


def test_group_advantages_hand_worked():
    # grpo [1, 0]: mean .5, std (ddof 1) sqrt(.5) = .70711 -> ±.5 / .70721
    assert advantage_fn_for("grpo")([1.0, 0.0]) == pytest.approx(
        [0.5 / (0.5**0.5 + 1e-4), -0.5 / (0.5**0.5 + 1e-4)]
    )
    # rloo [3, 1, 2]: 3 - 1.5, 1 - 2.5, 2 - 2
    assert advantage_fn_for("rloo")([3.0, 1.0, 2.0]) == pytest.approx([1.5, -1.5, 0.0])
    assert advantage_fn_for("dr_grpo")([3.0, 1.0]) == pytest.approx([1.0, -1.0])
    assert advantage_fn_for("grpo", "batch")([2.0]) == [2.0]
    assert is_zero_advantage([0.3, 0.3 + 1e-12])
    assert not is_zero_advantage([0.0])
    # L = 95, Lmax = 100, B = 10: excess 5 -> -5/10 * 2 = -1
    assert overlong_penalty(95, max_tokens=100, buffer=10, factor=2.0) == -1.0
    assert overlong_penalty(90, max_tokens=100, buffer=10, factor=2.0) == 0.0


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
        "--scheduling-policy fcfs", "--worker-extension-cls pkg.Ext", "--no-enable-prefix-caching",
        "--dtype auto", "--logprobs-mode processed_logprobs",
    ]:  # fmt: skip
        assert part in line
    assert "--enforce-eager" not in cmd
    assert "--disable-uvicorn-access-log" in cmd
    assert "--disable-uvicorn-access-log" not in server_command(
        ServerSettings(model="/m", access_log=True), 1
    )
    cpu = server_command(ServerSettings(model="/m", device="cpu"), 1)
    assert "--enforce-eager" in cpu
    assert cpu[cpu.index("--dtype") + 1] == "float32"
    assert "--gpu-memory-utilization" not in cpu


def test_server_settings_from_config():
    from telescope_config import TelescopeConfig, defaults

    cfg = TelescopeConfig.model_validate({**defaults(), "environments": [{"name": "countdown"}]})
    s = ServerSettings.from_config(cfg, device="cpu")
    assert (s.model, s.base_port, s.max_model_len) == (cfg.model, cfg.inference_base_port, cfg.max_model_len)
    assert s.tensor_parallel_size == cfg.inference_tensor_parallel_size


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
        with pytest.raises(ServerStartError, match=rf"\[{port}\].*inference_base_port") as info:
            start_servers(ServerSettings(model="/m", base_port=port), 2, log_dir=tmp_path)
    assert info.value.kind == "port in use"
    assert not list(tmp_path.iterdir())  # nothing was launched


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


# ---------------------------------------------------------------- supervise / restart with fake processes
def _fake_handle(
    index: int, port: int, log_path: Path, code: str = "import time; time.sleep(120)"
) -> ServerHandle:
    """A stand-in server: a sleeping Python process in its own session (stop() kills the group)."""
    with log_path.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    return ServerHandle(index, port, f"http://127.0.0.1:{port}", proc, log_path, env={"K": str(index)})


@pytest.fixture
def fake_group(tmp_path, monkeypatch):
    """A ServerGroup of two fake servers whose restarts launch fake servers too (recorded in ``launches``)."""
    from telescope_rollout import _servers

    launches: list[dict] = []

    def fake_launch(settings, *, port, log_path, index=0, extension_cls=None, env=None, url_host=None):
        launches.append(
            {"port": port, "log_path": log_path, "index": index, "ext": extension_cls, "env": env}
        )
        return _fake_handle(index, port, Path(log_path))

    monkeypatch.setattr(_servers, "launch_server", fake_launch)
    monkeypatch.setattr(ServerHandle, "healthy", lambda self, timeout_s=2.0: self.alive())
    handles = [_fake_handle(i, 9100 + i, tmp_path / f"vllm_{i}.log") for i in range(2)]
    group = ServerGroup(handles, ServerSettings(model="/m", base_port=9100), "pkg.Ext")
    yield group, launches
    group.stop(timeout_s=10)


async def test_restart_relaunches_on_the_same_port_log_and_env(fake_group):
    group, launches = fake_group
    old = group.handles[1]
    new = await group.restart(1, timeout_s=10)
    assert old.process.poll() is not None  # the old process was stopped first
    assert launches == [
        {"port": 9101, "log_path": old.log_path, "index": 1, "ext": "pkg.Ext", "env": {"K": "1"}}
    ]
    assert group.handles[1] is new
    assert new.alive()
    assert group.restarts == [0, 1]
    assert group.urls == ["http://127.0.0.1:9100", "http://127.0.0.1:9101"]


async def test_supervise_restarts_a_dead_server_then_fails_clearly(fake_group):
    group, launches = fake_group
    restarted: list[str] = []
    seen = asyncio.Event()

    async def on_restart(url: str) -> None:
        restarted.append(url)
        seen.set()

    task = asyncio.create_task(group.supervise(max_restarts=1, interval_s=0.01, on_restart=on_restart))
    dead = group.handles[0]
    dead.log_path.write_text("torch.OutOfMemoryError: CUDA out of memory\n")
    os.killpg(dead.process.pid, signal.SIGKILL)
    await asyncio.wait_for(seen.wait(), timeout=30)
    assert restarted == ["http://127.0.0.1:9100"]
    assert [launch["index"] for launch in launches] == [0]
    assert group.restarts == [1, 0]
    assert not task.done()  # still watching
    # the restarted server dies too: no restart left, the supervisor raises with the classified log
    os.killpg(group.handles[0].process.pid, signal.SIGKILL)
    with pytest.raises(ServerDiedError, match=r"server 0 .* died with exit code -9 \(out of memory\)"):
        await asyncio.wait_for(task, timeout=30)
    assert len(launches) == 1
    assert group.handles[1].alive()  # the healthy one was left alone


def test_stop_ends_every_server_process(fake_group):
    group, _ = fake_group
    procs = [h.process for h in group.handles]
    group.stop(timeout_s=10)
    assert [p.poll() for p in procs] == [-signal.SIGTERM, -signal.SIGTERM]
    group.stop(timeout_s=10)  # idempotent
