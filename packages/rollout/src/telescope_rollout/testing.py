"""Stand-ins for running the engine without servers or torch: a fake inference server, a fake
clock, and group advantages in plain Python.

``FakeInferenceServer`` is a :class:`~telescope_rollout.inference.CompletionClient` without HTTP.
By default every request is answered at once (the benchmark measures the engine's own overhead
with it); ``seconds_per_token`` and ``seconds_per_request`` make each answer take as long as a
server would (tools/bench_scale.py); ``hold`` makes requests wait until the test releases them, so
scheduling can be driven step by step.

:func:`group_advantages` is ``telescope_algos.group_advantages`` without torch, for the engine's
``advantage_fn`` in rollout's own tests and in programs that embed the engine without
telescope-algos; tests/test_advantage_parity.py (at the repository root) holds the two equal.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from telescope_rollout.inference._client import (
    Completion,
    CompletionClient,
    CompletionRequest,
    ServerTimeoutError,
    ServerUnavailableError,
)


@dataclass
class FakeRequest:
    """One request the fake server received."""

    url: str
    prompt: list[int] | str
    max_tokens: int
    sampling: dict[str, Any]
    priority: int
    request_id: str
    cache_salt: str = ""
    future: asyncio.Future[None] | None = None
    answered: bool = False


def default_reply(request: FakeRequest) -> tuple[str, list[int]]:
    """Text ``"ok"`` as token ids ``[1, 2]``."""
    return "ok", [1, 2]


@dataclass
class FakeInferenceServer(CompletionClient):
    """In-process stand-in for one or more vLLM servers.

    ``reply(request) -> (text, token_ids)`` decides the completion; logprobs are ``-0.5`` per
    token; finish reason ``"stop"``. ``hold(request) -> bool`` keeps a request pending until
    :meth:`release`. URLs in ``dead`` raise :class:`ServerUnavailableError`; URLs in ``hung``
    raise :class:`ServerTimeoutError` (what the real client raises when its timeout runs out).
    ``prompt_logprob(token_ids, i)`` is the logprob :meth:`prompt_logprobs` gives token ``i``
    (default ``-0.25``); ``scored`` records each ``(url, token_ids)`` it was asked to score.

    Latency: each answer comes ``seconds_per_request + seconds_per_token × tokens`` after its
    request (a server that decodes every request at its own pace, whatever the batch);
    ``keep_requests=False`` keeps no :class:`FakeRequest` (long benchmarks; ``pending`` and
    :meth:`release` then see none).
    """

    server_urls: list[str] = field(default_factory=lambda: ["http://fake-0"])
    reply: Callable[[FakeRequest], tuple[str, list[int]]] = default_reply
    hold: Callable[[FakeRequest], bool] | None = None
    dead: set[str] = field(default_factory=set[str])
    hung: set[str] = field(default_factory=set[str])
    finish_reason: str = "stop"
    requests: list[FakeRequest] = field(default_factory=list[FakeRequest])
    prompt_logprob: Callable[[list[int], int], float] = lambda ids, i: -0.25
    scored: list[tuple[str, list[int]]] = field(default_factory=list[tuple[str, list[int]]])
    seconds_per_token: float = 0.0
    seconds_per_request: float = 0.0
    keep_requests: bool = True

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

    async def generate(self, request: CompletionRequest) -> Completion:
        url = request.url
        req = FakeRequest(
            url,
            request.prompt,
            request.max_tokens,
            dict(request.sampling),
            request.priority,
            request.request_id,
            request.cache_salt,
        )
        if self.keep_requests:
            self.requests.append(req)
        if url in self.dead:
            raise ServerUnavailableError(f"{url}: connection refused (fake)", url)
        if url in self.hung:
            raise ServerTimeoutError(f"{url}: no answer within 1200 s (fake)", url)
        if self.hold is not None and self.hold(req):
            req.future = asyncio.get_running_loop().create_future()
            await req.future
        text, ids = self.reply(req)
        if self.seconds_per_request or self.seconds_per_token:
            await asyncio.sleep(self.seconds_per_request + self.seconds_per_token * len(ids))
        req.answered = True
        return Completion(
            text, list(ids), [-0.5] * len(ids), self.finish_reason, server=url, request_id=req.request_id
        )

    async def prompt_logprobs(self, url: str, token_ids: Sequence[int]) -> list[float | None]:
        ids = list(token_ids)
        self.scored.append((url, ids))
        if url in self.dead:
            raise ServerUnavailableError(f"{url}: connection refused (fake)", url)
        return [None, *(self.prompt_logprob(ids, i) for i in range(1, len(ids)))]


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


# ------------------------------------------------------------------ group advantages without torch
ALGORITHMS = ("grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo", "opd")
EPS = 1e-4
"""Added to the group's standard deviation (GRPO), as telescope-algos does."""


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); 0 for a single value."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def group_advantages(
    rewards: Sequence[float], *, algorithm: str = "grpo", advantage_norm: str = "group"
) -> list[float]:
    """One group's advantages under ``algorithm`` and ``advantage_norm`` (what telescope-algos computes).

    grpo, cispo, gspo, sapo, opd: ``(r - mean) / (std + 1e-4)``; rloo: ``(r - mean) * n / (n - 1)`` (0
    for a group of one); dr_grpo: ``r - mean``. Batch normalisation (``advantage_norm="batch"``,
    and reinforce_pp always) returns its group stage, ``r - mean`` (the raw reward for a group of
    one); the training loop whitens over the step. rloo and dr_grpo with ``"batch"`` are errors.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if advantage_norm not in ("group", "batch"):
        raise ValueError(f"unknown advantage_norm {advantage_norm!r}; known: group, batch")
    r = [float(x) for x in rewards]
    m, n = _mean(r), len(r)
    if algorithm in ("rloo", "dr_grpo"):
        if advantage_norm == "batch":
            raise ValueError(f"advantage_norm='batch' is not defined for {algorithm}; use 'group'")
        scale = (n / (n - 1) if n > 1 else 0.0) if algorithm == "rloo" else 1.0
        return [(x - m) * scale for x in r]
    if algorithm == "reinforce_pp" or advantage_norm == "batch":
        return [x - m for x in r] if n > 1 else r
    s = _std(r)
    return [(x - m) / (s + EPS) for x in r]
