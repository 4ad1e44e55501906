"""Per-token logprobs of sampled tokens under a frozen model: the teacher of on-policy distillation,
the reference model of the reference KL (docs/rollout.md, "Teachers and reference models").

A :class:`TokenScorer` answers ``score(prompt_ids, completion_ids)`` with one logprob per completion
token. :class:`ServedScorer` asks vLLM servers of that model for the ``prompt_logprobs`` of the whole
sequence (prefill only: one token is generated and thrown away), each request to the server with the
fewest in flight (ties in turn), and can be told which of its servers are out while they restart.
The engine calls the scorers of a run on each finished sample,
while other samples still generate, so scoring overlaps generation.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from telescope_rollout.inference._client import CompletionClient, ServerUnavailableError


class TokenScorer(ABC):
    """Logprobs of given tokens under one fixed model; ``name`` says which (``teacher``, ``ref``)."""

    name: str

    @abstractmethod
    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """The model's logprob of each of ``completion_ids`` after ``prompt_ids`` and the completion
        tokens before it: ``len(completion_ids)`` floats."""


class ServedScorer(TokenScorer):
    """A :class:`TokenScorer` over the servers of ``client`` (``client.server_urls``).

    A server can be taken out (:meth:`server_lost`) and put back (:meth:`server_back`), as a run's
    server supervisor does while it restarts one: requests go to the servers that are up, and wait
    while none is. With ``on_server_down`` set, a request that finds its server unreachable
    (``ServerUnavailableError``) takes the server out, reports ``(url, error)`` there and goes again
    (on another server, or once one is back); without it, the error is the request's. :meth:`fail`
    ends the waiting with an error (every server of the model is gone).
    """

    RETRIES = 3
    """Times a request goes again after its server was found unreachable (``on_server_down`` set)."""

    def __init__(
        self,
        client: CompletionClient,
        *,
        name: str,
        on_server_down: Callable[[str, str], None] | None = None,
    ):
        if not client.server_urls:
            raise ValueError(f"the {name} scorer needs at least one server")
        self.client = client
        self.name = name
        self.on_server_down = on_server_down
        self._in_flight = dict.fromkeys(client.server_urls, 0)
        self._up = set(client.server_urls)
        self._changed = asyncio.Event()
        self._failed: Exception | None = None
        self._turn = 0

    @property
    def servers_up(self) -> list[str]:
        """The servers requests go to now, in the client's order."""
        return [u for u in self._in_flight if u in self._up]

    def server_lost(self, url: str) -> None:
        """Send ``url`` nothing more until :meth:`server_back`."""
        self._up.discard(url)

    def server_back(self, url: str) -> None:
        """``url`` takes requests again (waiting ones go at once)."""
        if url in self._in_flight:
            self._up.add(url)
            self._wake()

    def fail(self, error: Exception) -> None:
        """Every request, waiting or to come, raises ``error`` (no server of this model is left)."""
        self._failed = error
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _pick(self) -> str:
        """The up server with the fewest requests in flight (ties in turn), once one is up."""
        while True:
            if self._failed is not None:
                raise self._failed
            urls = self.servers_up
            if urls:
                self._turn += 1
                order = urls[self._turn % len(urls) :] + urls[: self._turn % len(urls)]
                return min(order, key=self._in_flight.__getitem__)
            await self._changed.wait()

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        if not completion_ids:
            return []
        retries = self.RETRIES if self.on_server_down is not None else 0
        for attempt in range(retries + 1):
            url = await self._pick()
            self._in_flight[url] += 1
            try:
                values = await self.client.prompt_logprobs(url, [*prompt_ids, *completion_ids])
            except ServerUnavailableError as exc:
                if self.on_server_down is None or attempt == retries:
                    raise
                self.server_lost(url)
                self.on_server_down(url, str(exc))
                continue
            finally:
                self._in_flight[url] -= 1
            return [0.0 if v is None else v for v in values[len(prompt_ids) :]]
        raise AssertionError("unreachable")  # the last attempt returns or raises
