"""Test doubles for the rollout engine: an in-process fake inference server and a fake clock.

``FakeInferenceServer`` implements the client interface the engine uses (``server_urls``,
``complete``) without HTTP. By default every request is answered at once (the benchmark measures
the engine's own overhead with it); ``hold`` makes requests wait until the test releases them,
so scheduling can be driven step by step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from telescope_rollout._client import Completion, ServerTimeoutError, ServerUnavailableError


@dataclass
class FakeRequest:
    """One request the fake server received."""

    url: str
    prompt: list[int] | str
    max_tokens: int
    sampling: dict[str, Any]
    priority: int
    request_id: str
    future: asyncio.Future[None] | None = None
    answered: bool = False


def default_reply(request: FakeRequest) -> tuple[str, list[int]]:
    """Text ``"ok"`` as token ids ``[1, 2]``."""
    return "ok", [1, 2]


@dataclass
class FakeInferenceServer:
    """In-process stand-in for one or more vLLM servers.

    ``reply(request) -> (text, token_ids)`` decides the completion; logprobs are ``-0.5`` per
    token; finish reason ``"stop"``. ``hold(request) -> bool`` keeps a request pending until
    :meth:`release`. URLs in ``dead`` raise :class:`ServerUnavailableError`; URLs in ``hung``
    raise :class:`ServerTimeoutError` (what the real client raises when its timeout runs out).
    """

    server_urls: list[str] = field(default_factory=lambda: ["http://fake-0"])
    reply: Callable[[FakeRequest], tuple[str, list[int]]] = default_reply
    hold: Callable[[FakeRequest], bool] | None = None
    dead: set[str] = field(default_factory=set)
    hung: set[str] = field(default_factory=set)
    finish_reason: str = "stop"
    requests: list[FakeRequest] = field(default_factory=list)

    @property
    def pending(self) -> list[FakeRequest]:
        """Held requests not answered and not cancelled."""
        return [r for r in self.requests if r.future is not None and not r.future.done()]

    def release(self, predicate: Callable[[FakeRequest], bool] | None = None, n: int | None = None) -> int:
        """Answer held requests (those matching ``predicate``, at most ``n``); returns how many."""
        done = 0
        for r in self.pending:
            if n is not None and done >= n:
                break
            if predicate is None or predicate(r):
                assert r.future is not None
                r.future.set_result(None)
                done += 1
        return done

    async def complete(
        self,
        url: str,
        prompt: list[int] | str,
        *,
        max_tokens: int,
        sampling: dict[str, Any] | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> Completion:
        req = FakeRequest(url, prompt, max_tokens, dict(sampling or {}), priority, request_id or "")
        self.requests.append(req)
        if url in self.dead:
            raise ServerUnavailableError(f"{url}: connection refused (fake)", url)
        if url in self.hung:
            raise ServerTimeoutError(f"{url}: no answer within 1200 s (fake)", url)
        if self.hold is not None and self.hold(req):
            req.future = asyncio.get_running_loop().create_future()
            await req.future
        text, ids = self.reply(req)
        req.answered = True
        return Completion(
            text, list(ids), [-0.5] * len(ids), self.finish_reason, server=url, request_id=req.request_id
        )


class FakeClock:
    """A clock that only moves when told: ``clock()`` reads it, ``advance(s)`` moves it."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def settle(rounds: int = 50) -> None:
    """Let every ready task run (``rounds`` passes of the event loop)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def sample_ids(requests: Sequence[FakeRequest]) -> list[int]:
    """Sample ids from request ids ``sample-<id>[-turn-<k>]``."""
    return [int(r.request_id.split("-")[1]) for r in requests]
