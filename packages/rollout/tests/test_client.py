"""InferenceClient against an in-process HTTP fake (how vLLM servers are launched is the orchestrator's:
packages/orchestrator/tests/test_vllm_servers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from telescope_rollout.inference import (
    InferenceClient,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
    cache_salt,
)

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
        if body["prompt"] == [66]:  # vLLM's answer once its engine core died
            msg = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            return web.json_response({"error": {"message": msg, "type": "InternalServerError"}}, status=500)
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


async def test_the_cache_salt_goes_in_the_body_and_names_the_weight_version():
    seen: list[dict] = []
    async with fake_vllm(seen) as url, InferenceClient([url], model="m") as client:
        await client.complete(url, [1, 2], max_tokens=3, cache_salt=cache_salt(0))
        await client.complete(url, [1, 2], max_tokens=3, cache_salt=cache_salt(7))
        await client.complete(url, [1, 2], max_tokens=3)  # no salt: none sent (vLLM refuses "")
    assert [b.get("cache_salt") for b in seen] == ["telescope-w0", "telescope-w7", None]
    assert "cache_salt" not in seen[2]


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


async def test_a_server_whose_engine_died_is_unavailable():
    # vLLM's API process still answers, with a 500 naming the dead engine: the server is gone (a
    # supervisor restarts it), not this sample's fault
    async with fake_vllm([]) as url, InferenceClient([url], model="m") as c:
        with pytest.raises(ServerUnavailableError, match="its engine died"):
            await c.complete(url, [66], max_tokens=1)


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


async def test_the_fake_server_answers_after_its_latency_model_and_is_a_context_manager(monkeypatch):
    """``FakeInferenceServer``'s latency: ``seconds_per_request + seconds_per_token × tokens`` before
    each answer (tools/bench_scale.py); any client can be entered like ``InferenceClient``."""
    from telescope_rollout import testing

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)  # the module's asyncio is this one
    fake = testing.FakeInferenceServer(
        reply=lambda r: ("abc", [7, 8, 9]), seconds_per_token=0.25, seconds_per_request=1.0,
        keep_requests=False,
    )  # fmt: skip
    async with fake as client:
        done = await client.complete("http://fake-0", [1, 2], max_tokens=3)
    assert done.token_ids == [7, 8, 9]
    assert slept == [1.75]
    assert fake.requests == []  # keep_requests=False
