"""Per-token logprobs of sampled tokens under a frozen model: the teacher of on-policy distillation,
the reference model of the reference KL (docs/rollout.md, "Teachers and reference models").

A :class:`TokenScorer` answers ``score(prompt_ids, completion_ids)`` with one logprob per completion
token. :class:`ServedScorer` asks vLLM servers of that model for the ``prompt_logprobs`` of the whole
sequence (prefill only: one token is generated and thrown away), each request to the server with the
fewest in flight (ties in turn). The engine calls the scorers of a run on each finished sample,
while other samples still generate, so scoring overlaps generation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from telescope_rollout.inference._client import CompletionClient


class TokenScorer(ABC):
    """Logprobs of given tokens under one fixed model; ``name`` says which (``teacher``, ``ref``)."""

    name: str

    @abstractmethod
    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """The model's logprob of each of ``completion_ids`` after ``prompt_ids`` and the completion
        tokens before it: ``len(completion_ids)`` floats."""


class ServedScorer(TokenScorer):
    """A :class:`TokenScorer` over the servers of ``client`` (``client.server_urls``)."""

    def __init__(self, client: CompletionClient, *, name: str):
        if not client.server_urls:
            raise ValueError(f"the {name} scorer needs at least one server")
        self.client = client
        self.name = name
        self._in_flight = dict.fromkeys(client.server_urls, 0)
        self._turn = 0

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        if not completion_ids:
            return []
        urls = list(self._in_flight)
        self._turn += 1
        order = urls[self._turn % len(urls) :] + urls[: self._turn % len(urls)]
        url = min(order, key=self._in_flight.__getitem__)
        self._in_flight[url] += 1
        try:
            values = await self.client.prompt_logprobs(url, [*prompt_ids, *completion_ids])
        finally:
            self._in_flight[url] -= 1
        return [0.0 if v is None else v for v in values[len(prompt_ids) :]]
