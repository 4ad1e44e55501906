"""``ServedScorer`` over several servers: the least loaded gets each request, a server taken out
gets none until it is back, requests wait while none is up, a server found unreachable is reported
and the request goes again, and a scorer told that its model is gone fails what waits."""

from __future__ import annotations

import asyncio

import pytest

from telescope_rollout.inference import ServedScorer, ServerUnavailableError
from telescope_rollout.testing import FakeInferenceServer

T0, T1 = "http://teacher-0", "http://teacher-1"


def _teacher(**kw) -> FakeInferenceServer:
    server = FakeInferenceServer(server_urls=[T0, T1], **kw)
    server.prompt_logprob = lambda ids, i: -float(ids[i])
    return server


async def test_a_server_taken_out_gets_nothing_until_it_is_back():
    server = _teacher()
    scorer = ServedScorer(server, name="teacher")
    assert await scorer.score([1, 2], [3, 4]) == [-3.0, -4.0]  # the completion's tokens only
    scorer.server_lost(T0)
    assert scorer.servers_up == [T1]
    for _ in range(4):
        await scorer.score([1], [2])
    assert {url for url, _ in server.scored[1:]} == {T1}
    scorer.server_back(T0)
    for _ in range(4):
        await scorer.score([1], [2])
    assert {url for url, _ in server.scored[5:]} == {T0, T1}


async def test_requests_wait_while_no_server_is_up_and_go_once_one_is_back():
    server = _teacher()
    scorer = ServedScorer(server, name="teacher")
    scorer.server_lost(T0)
    scorer.server_lost(T1)
    waiting = asyncio.ensure_future(scorer.score([1], [5]))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert server.scored == []
    scorer.server_back(T1)
    assert await asyncio.wait_for(waiting, 5) == [-5.0]
    assert server.scored == [(T1, [1, 5])]


async def test_an_unreachable_server_is_reported_and_the_request_goes_to_another():
    server = _teacher(dead={T0})
    reported: list[tuple[str, str]] = []
    scorer = ServedScorer(
        server, name="teacher", on_server_down=lambda url, error: reported.append((url, error))
    )
    results = [await scorer.score([1], [7]) for _ in range(3)]
    assert results == [[-7.0]] * 3
    assert [url for url, _ in reported] == [T0]  # found once, then out until the supervisor says
    assert "connection refused" in reported[0][1]
    assert scorer.servers_up == [T1]


async def test_without_a_supervisor_an_unreachable_server_is_the_requests_error():
    scorer = ServedScorer(_teacher(dead={T0, T1}), name="teacher")
    with pytest.raises(ServerUnavailableError):
        await scorer.score([1], [2])


async def test_a_request_that_finds_every_server_unreachable_stops_after_its_retries():
    server = _teacher(dead={T0, T1})
    reported: list[str] = []

    def down(url: str, error: str) -> None:
        reported.append(url)
        scorer.server_back(url)  # a supervisor that keeps finding it fine (a blip)

    scorer = ServedScorer(server, name="teacher", on_server_down=down)
    with pytest.raises(ServerUnavailableError):
        await scorer.score([1], [2])
    assert len(server.scored) == ServedScorer.RETRIES + 1


async def test_a_failed_model_fails_the_waiting_requests_and_later_ones():
    scorer = ServedScorer(_teacher(), name="teacher")
    scorer.server_lost(T0)
    scorer.server_lost(T1)
    waiting = asyncio.ensure_future(scorer.score([1], [2]))
    await asyncio.sleep(0.01)
    scorer.fail(RuntimeError("no teacher server is left"))
    with pytest.raises(RuntimeError, match="no teacher server is left"):
        await asyncio.wait_for(waiting, 5)
    scorer.server_back(T0)
    with pytest.raises(RuntimeError, match="no teacher server is left"):
        await scorer.score([1], [2])
