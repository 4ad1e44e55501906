"""The HTTP layer turns each way a server call can fail into one typed error naming the server."""

from __future__ import annotations

import json

import httpx
import pytest

from telescope_weightsync import ReceiverMissing, ServerError, ServerTimeout, WeightSyncError
from telescope_weightsync._http import collective_rpc

URL = "http://10.0.0.7:8000"


def _client(handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def _call(handler):
    with _client(handler) as client:
        return collective_rpc(client, URL, "telescope_version", {"group": "full"}, timeout_s=1.0)


def test_results_come_back_one_per_worker():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(request.read())
        return httpx.Response(200, json={"results": [3, 3]})

    assert _call(handler) == [3, 3]
    assert seen["body"]["method"] == "telescope_version"
    assert seen["body"]["args"] == ['{"group": "full"}']  # vLLM forwards string arguments only


@pytest.mark.parametrize(
    ("response", "error", "words"),
    [
        (httpx.Response(404), ReceiverMissing, "VLLM_SERVER_DEV_MODE=1"),
        (httpx.Response(500, text="boom in the worker"), ServerError, "HTTP 500: boom in the worker"),
        (httpx.Response(200, json={"results": []}), ServerError, "no worker results"),
        (httpx.Response(200, json=[1, 2]), ServerError, "no worker results"),
        (httpx.Response(200, text="not json"), ServerError, "non-JSON"),
    ],
    ids=["404", "500", "no-results", "not-a-mapping", "not-json"],
)
def test_each_bad_answer_is_a_server_error_naming_the_server(response, error, words):
    with pytest.raises(error, match=words) as info:
        _call(lambda request: response)
    assert info.value.server == URL
    assert URL in str(info.value)
    assert isinstance(info.value, WeightSyncError)


def test_no_answer_in_time_is_a_server_timeout():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(ServerTimeout, match="did not answer telescope_version within 1s") as info:
        _call(handler)
    assert info.value.server == URL


def test_a_refused_connection_is_a_server_error():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServerError, match="ConnectError: refused") as info:
        _call(handler)
    assert not isinstance(info.value, ServerTimeout)
    assert info.value.server == URL


async def test_the_async_version_probe_takes_the_lowest_worker_version_and_types_its_failures():
    from telescope_weightsync import probe_version

    def answer(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.read())["method"] == "telescope_version"
        return httpx.Response(200, json={"results": [4, 3]})

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        assert await probe_version(client, URL + "/", timeout_s=1.0) == 3  # a TP worker behind
    async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
        with pytest.raises(ServerTimeout, match="did not answer telescope_version within 1s"):
            await probe_version(client, URL, timeout_s=1.0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500))) as client:
        with pytest.raises(ServerError, match="HTTP 500"):
            await probe_version(client, URL, timeout_s=1.0)
