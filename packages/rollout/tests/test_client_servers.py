"""InferenceClient against an in-process HTTP fake, server command lines and failure messages."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from telescope_rollout import (
    InferenceClient,
    PromptTooLongError,
    ServerSettings,
    ServerStartError,
    ServerUnavailableError,
    classify_failure,
    server_command,
    start_servers,
)
from telescope_rollout._advantage import advantage_fn_for, is_zero_advantage, overlong_penalty
from telescope_rollout._servers import ServerHandle

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


def fake_vllm(seen: list[dict], fail_first: int = 0):
    state = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        state["n"] += 1
        if state["n"] <= fail_first:
            raise httpx.ConnectError("refused", request=request)
        body = json.loads(request.content)
        seen.append(body)
        if len(body["prompt"]) > 10:
            msg = (
                "This model's maximum context length is 10 tokens. However, your request has 12 input tokens."
            )
            return httpx.Response(400, json={"error": {"message": msg}})
        return httpx.Response(200, json=BODY)

    return httpx.MockTransport(handler)


async def test_complete_sends_ids_and_parses_tokens_and_logprobs():
    seen: list[dict] = []
    async with InferenceClient(["http://s0/"], transport=fake_vllm(seen)) as client:
        c = await client.complete(
            "http://s0", [1, 2, 3], max_tokens=7, sampling={"temperature": 0.5}, priority=-2
        )
    assert seen[0] == {
        "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 7, "n": 1, "logprobs": 1,
        "return_token_ids": True, "skip_special_tokens": False, "include_stop_str_in_output": False,
        "temperature": 0.5, "priority": -2,
    }  # fmt: skip
    assert (c.text, c.token_ids, c.logprobs, c.finish_reason) == (" hi", [5, 6], [-0.25, 0.0], "length")
    assert c.prompt_token_ids == [1, 2, 3]
    assert c.server == "http://s0"


async def test_connection_errors_are_retried_then_reported():
    seen: list[dict] = []
    async with InferenceClient(["http://s0"], model="m", backoff_s=0.0, transport=fake_vllm(seen, 2)) as c:
        out = await c.complete("http://s0", [1], max_tokens=1)
    assert out.token_ids == [5, 6]
    async with InferenceClient(
        ["http://s0"], model="m", retries=1, backoff_s=0.0, transport=fake_vllm(seen, 5)
    ) as c:
        with pytest.raises(ServerUnavailableError, match="after 2 attempts"):
            await c.complete("http://s0", [1], max_tokens=1)


async def test_context_length_error_becomes_prompt_too_long():
    async with InferenceClient(["http://s0"], model="m", transport=fake_vllm([])) as c:
        with pytest.raises(PromptTooLongError) as info:
            await c.complete("http://s0", list(range(12)), max_tokens=1)
    assert (info.value.prompt_tokens, info.value.max_model_len) == (12, 10)


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
        "--dtype auto",
    ]:  # fmt: skip
        assert part in line
    assert "--enforce-eager" not in cmd
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
