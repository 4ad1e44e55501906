"""HTTP client for vLLM's OpenAI-compatible ``/v1/completions`` on many servers.

Prompts go out as token ids (``return_token_ids`` brings the completion's ids back), with one
logprob per generated token, and with vLLM's ``cache_salt`` when the caller gives one (the engine
gives :func:`cache_salt` of the weight version the server holds, so prefix-cache blocks are shared
only between requests under the same weights). Connection failures are retried with exponential backoff
(``backoff_s * 2**attempt``); each request has its own timeout; vLLM's context-length errors
become :class:`PromptTooLongError`. One ``aiohttp.ClientSession`` (connection pool, HTTP/1.1
keep-alive) serves all servers; it is opened lazily inside the running event loop, so the client
can be built outside one.

Why aiohttp and not httpx here: httpcore 1.0's connection pool walks every pooled connection
(with a socket poll each) on every request start and end, so its cost per request grows with
the number of requests in flight. Measured on 2 cores against a trivial server: httpx spent
8-17 ms of CPU per request at 64-512 requests in flight (about 90 requests/s, less than a
tiny model on vLLM generates), aiohttp 0.4-0.5 ms (encode/httpcore#1035). The engine keeps
hundreds of requests in flight per server, so this is its hot path.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import aiohttp
import structlog

log = structlog.get_logger()

# connection refused/reset, server gone before or while answering, connect timeout: retried.
# A read timeout (aiohttp's other TimeoutError subclasses) is not: the server is alive but slow.
_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
_CTX = re.compile(r"maximum context length is (\d+) tokens")
_INPUT = re.compile(r"(?:request has|prompt contains|your prompt contains|input has) (\d+) (?:input )?tokens")


def cache_salt(version: int) -> str:
    """vLLM's prefix-cache salt for requests sent while a server holds weight version ``version``.

    vLLM hashes the salt into the first cache block of a prompt, so requests with different salts
    never share cached KV blocks: a prompt prefix computed under older weights is not reused once
    requests name a newer version (docs/rollout.md, "Prefix caching and weight updates").
    """
    return f"telescope-w{version}"


ENGINE_DEAD = "EngineCore encountered an issue"
"""What vLLM's API process answers (HTTP 500) once its engine core died: the server is gone."""


class InferenceError(RuntimeError):
    """A request to an inference server failed; ``url`` names the server."""

    def __init__(self, message: str, url: str = ""):
        super().__init__(message)
        self.url = url


class ServerUnavailableError(InferenceError):
    """The server could not be reached after all retries (it died or never started), or its
    engine died (vLLM's API process answers 500 with :data:`ENGINE_DEAD`)."""


class ServerTimeoutError(InferenceError):
    """The server took the request but gave no answer within the timeout (hung, or far too slow)."""


class PromptTooLongError(InferenceError):
    """The prompt leaves no room for a completion within the server's ``max_model_len``."""

    def __init__(self, prompt_tokens: int, max_model_len: int, url: str = "", detail: str = ""):
        msg = f"prompt has {prompt_tokens} tokens, the context holds {max_model_len}"
        super().__init__(f"{msg}: {detail}" if detail else msg, url)
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


@dataclass
class Completion:
    """One generated completion, as the server returned it."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    prompt_token_ids: list[int] = field(default_factory=list[int])
    request_id: str = ""
    server: str = ""
    latency_s: float = 0.0
    """Seconds around the HTTP request, retries included (0.0 where not measured)."""
    timings: dict[str, float] = field(default_factory=dict[str, float])
    """Seconds: ``e2e_s`` (= ``latency_s``, where measured) and, when the server sends its
    per-request ``metrics`` (vLLM with ``--enable-per-request-metrics``), :func:`server_timings`."""


@dataclass(frozen=True)
class CompletionRequest:
    """One ``n=1`` completion request, as the engine and the eval runner send it."""

    url: str
    prompt: list[int] | str
    """Token ids (what the engine sends) or text."""
    max_tokens: int
    sampling: Mapping[str, Any] = field(default_factory=dict[str, Any])
    """Sampling fields of the request body (temperature, top_p, ...)."""
    priority: int = 0
    """vLLM's request priority (lower first under ``--scheduling-policy priority``); 0 is not sent."""
    request_id: str = ""
    cache_salt: str = ""
    """vLLM's prefix-cache salt (:func:`cache_salt`): cached prompt blocks are shared only between
    requests with the same salt; "" is not sent (the server's unsalted cache)."""


class CompletionClient(ABC):
    """What the engine and the eval runner need from a client: its servers, one completion at a time.

    :class:`InferenceClient` asks vLLM servers; ``telescope_rollout.testing.FakeInferenceServer``
    answers in process. A subclass implements :meth:`generate`.
    """

    server_urls: list[str]

    async def complete(
        self,
        url: str,
        prompt: list[int] | str,
        *,
        max_tokens: int,
        sampling: Mapping[str, Any] | None = None,
        priority: int = 0,
        request_id: str | None = None,
        cache_salt: str = "",
    ) -> Completion:
        """Generate one completion of ``prompt`` (token ids or text) on server ``url``."""
        request = CompletionRequest(
            url, prompt, max_tokens, dict(sampling or {}), priority, request_id or "", cache_salt
        )
        return await self.generate(request)

    @abstractmethod
    async def generate(self, request: CompletionRequest) -> Completion:
        """Answer one request."""

    async def prompt_logprobs(self, url: str, token_ids: Sequence[int]) -> list[float | None]:
        """The logprob of each of ``token_ids`` given the ones before it, under server ``url``'s
        model (None for the first token, which nothing predicts). A client that cannot score raises."""
        raise InferenceError(f"{type(self).__name__} cannot score tokens", url)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:  # noqa: B027 (a default: most clients hold nothing)
        """Release what the client holds (an HTTP session); a client that holds nothing does nothing."""


_VLLM_TIMINGS = {
    "queue_time_ms": "queue_s",
    "time_to_first_token_ms": "prefill_s",
    "generation_time_ms": "decode_s",
}
"""vLLM's per-request ``metrics`` fields (milliseconds) -> our names (seconds)."""


def server_timings(metrics: Any) -> dict[str, float]:
    """Per-request timings (seconds) from a vLLM response's ``metrics`` object; {} without one.

    vLLM (0.32, ``--enable-per-request-metrics``) reports ``queue_time_ms`` (queued until
    scheduled), ``time_to_first_token_ms`` (scheduled until the first token: the prefill) and
    ``generation_time_ms`` (first to last token: the decode). They become ``queue_s``,
    ``prefill_s`` and ``decode_s``; ``inference_s`` = prefill + decode and ``ttft_s`` = queue +
    prefill (queued until the first token) where both parts are known. A missing or null field
    is left out.
    """
    if not isinstance(metrics, dict):
        return {}
    fields = cast(dict[str, Any], metrics)
    out: dict[str, float] = {}
    for key, name in _VLLM_TIMINGS.items():
        value = fields.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value) / 1000.0
    if "prefill_s" in out and "decode_s" in out:
        out["inference_s"] = out["prefill_s"] + out["decode_s"]
    if "queue_s" in out and "prefill_s" in out:
        out["ttft_s"] = out["queue_s"] + out["prefill_s"]
    return out


def parse_completion(data: dict[str, Any], url: str = "", latency_s: float = 0.0) -> Completion:
    """A :class:`Completion` from a /v1/completions response body (``n=1``)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise InferenceError(f"malformed completion response from {url}: {str(data)[:300]}", url) from exc
    ids = choice.get("token_ids")
    if ids is None:
        raise InferenceError(
            f"{url} returned no token_ids: the server must support `return_token_ids` (vLLM >= 0.10)", url
        )
    logprobs_field: Any = choice.get("logprobs") or {}  # response JSON
    lp: Any = logprobs_field.get("token_logprobs") or []
    logprobs = [float(x) if x is not None else 0.0 for x in lp]
    if len(logprobs) != len(ids):
        logprobs = (logprobs + [0.0] * len(ids))[: len(ids)]
    return Completion(
        text=choice.get("text") or "",
        token_ids=list(ids),
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason"),
        prompt_token_ids=list(choice.get("prompt_token_ids") or []),
        request_id=str(data.get("id", "")),
        server=url,
        latency_s=latency_s,
        timings={**server_timings(data.get("metrics")), **({"e2e_s": latency_s} if latency_s > 0 else {})},
    )


def parse_prompt_logprobs(
    data: dict[str, Any], token_ids: Sequence[int], url: str = ""
) -> list[float | None]:
    """The logprob of each prompt token from a ``prompt_logprobs`` answer of ``/v1/completions``: vLLM
    sends, per position, a map from token id (as text) to ``{"logprob": ...}`` that holds the prompt's
    own token (None at position 0)."""
    try:
        entries: Any = data["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        entries = None
    if not isinstance(entries, list) or len(cast("list[Any]", entries)) != len(token_ids):
        got = len(cast("list[Any]", entries)) if isinstance(entries, list) else "none"
        raise InferenceError(f"{url} sent {got} prompt logprobs for {len(token_ids)} tokens", url)
    rows = cast("list[dict[str, Any] | None]", entries)
    out: list[float | None] = [None]
    for i in range(1, len(token_ids)):
        value: Any = (rows[i] or {}).get(str(token_ids[i]))
        logprob: Any = cast("dict[str, Any]", value).get("logprob") if isinstance(value, dict) else None
        if not isinstance(logprob, int | float):
            raise InferenceError(f"{url} sent no prompt logprob for token {token_ids[i]} at {i}", url)
        out.append(float(logprob))
    return out


def _length_error(message: str, prompt_len: int, url: str) -> PromptTooLongError | None:
    ctx = _CTX.search(message)
    if not ctx:
        return None
    m = _INPUT.search(message)
    return PromptTooLongError(int(m.group(1)) if m else prompt_len, int(ctx.group(1)), url, message[:300])


class InferenceClient(CompletionClient):
    """Completions from a set of vLLM servers.

    ``model`` is the served model name sent with every request; when None it is read once per
    server from ``GET /v1/models``. ``max_connections`` caps open connections over all servers
    (one per request in flight); keep it above servers x lane slots per server. Idle connections
    are dropped after ``keepalive_s`` to ``2 * keepalive_s`` (aiohttp sweeps its pool every
    ``keepalive_s``), below the 5 s after which vLLM's uvicorn closes them, so a connection the
    server is closing is rarely reused (when it is, the request is retried). Use the client from
    one event loop.
    """

    def __init__(
        self,
        server_urls: Sequence[str],
        *,
        model: str | None = None,
        timeout_s: float = 1200.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        connect_timeout_s: float = 10.0,
        max_connections: int = 4096,
        keepalive_s: float = 2.0,
    ):
        if not server_urls:
            raise ValueError("InferenceClient needs at least one server URL")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("InferenceClient: timeout_s and connect_timeout_s must be > 0")
        self.server_urls = [u.rstrip("/") for u in server_urls]
        self.model = model
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(connect_timeout_s, timeout_s))
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self._models: dict[str, str] = {}

    async def __aenter__(self) -> Self:
        self._session()
        return self

    def _session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise InferenceError("the InferenceClient is closed")
        if self._http is None:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, keepalive_timeout=self.keepalive_s, ttl_dns_cache=300
            )
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, json_serialize=json.dumps
            )
        return self._http

    async def aclose(self) -> None:
        """Close the connection pool; requests still running fail."""
        self._closed = True
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _send(
        self, method: str, url: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> tuple[int, bytes]:
        """One request, retried on connection errors with exponential backoff: (status, body)."""
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        for attempt in range(self.retries + 1):
            try:
                async with self._session().request(method, url, timeout=timeout, **kwargs) as r:
                    return r.status, await r.read()
            except aiohttp.ConnectionTimeoutError as exc:
                err: Exception = exc
            except TimeoutError as exc:
                raise ServerTimeoutError(
                    f"{url}: no answer within {timeout.total} s ({type(exc).__name__})",
                    url.split("/v1/", maxsplit=1)[0],
                ) from exc
            except _RETRYABLE as exc:
                err = exc
            if attempt >= self.retries or self._closed:
                raise ServerUnavailableError(
                    f"{url}: {type(err).__name__}: {err} (after {attempt + 1} attempts); "
                    "is the inference server running? Its log is in the run directory's logs/",
                    url.split("/v1/", maxsplit=1)[0],
                ) from err
            log.debug("inference_retry", url=url, attempt=attempt + 1, error=str(err))
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def healthy(self, url: str, timeout_s: float = 2.0) -> bool:
        """True when ``GET /health`` answers 200 (no retries)."""
        try:
            async with self._session().get(
                f"{url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def model_name(self, url: str) -> str:
        """The served model name: the one given, or the first of ``GET /v1/models``."""
        if self.model:
            return self.model
        if url not in self._models:
            status, body = await self._send("GET", f"{url}/v1/models")
            if status != 200:
                raise InferenceError(f"{url}/v1/models answered {status}: {body[:300]!r}", url)
            self._models[url] = json.loads(body)["data"][0]["id"]
        return self._models[url]

    async def generate(self, request: CompletionRequest) -> Completion:
        """POST the request to ``{url}/v1/completions`` (with token ids and one logprob per token back,
        and the request's ``cache_salt`` when it has one)."""
        url, prompt = request.url, request.prompt
        body: dict[str, Any] = {
            "model": await self.model_name(url),
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "n": 1,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": False,
            **request.sampling,
        }
        if request.priority:
            body["priority"] = request.priority
        if request.request_id:
            body["request_id"] = request.request_id
        if request.cache_salt:
            body["cache_salt"] = request.cache_salt
        t0 = time.perf_counter()
        status, raw = await self._send("POST", f"{url}/v1/completions", json=body)
        latency = time.perf_counter() - t0
        return parse_completion(self._answer(url, status, raw, prompt), url, latency)

    def _answer(self, url: str, status: int, raw: bytes, prompt: list[int] | str) -> dict[str, Any]:
        """The JSON of a 200 answer; any other status as its error type."""
        if status != 200:
            text = raw.decode("utf-8", "replace")
            prompt_len = len(prompt) if isinstance(prompt, list) else 0
            err = _length_error(text, prompt_len, url) if status == 400 else None
            if err is not None:
                raise err
            if status >= 500 and ENGINE_DEAD in text:
                raise ServerUnavailableError(f"{url}: its engine died (answered {status}: {text[:300]})", url)
            raise InferenceError(f"{url} answered {status}: {text[:500]}", url)
        try:
            return cast("dict[str, Any]", json.loads(raw))
        except ValueError as exc:
            raise InferenceError(
                f"{url} answered 200 with a body that is not JSON: {raw[:300]!r}", url
            ) from exc

    async def prompt_logprobs(self, url: str, token_ids: Sequence[int]) -> list[float | None]:
        """vLLM's ``prompt_logprobs`` of ``token_ids`` (one generated token, discarded): the
        distribution before temperature, whatever the server's sampling settings."""
        ids = [int(t) for t in token_ids]
        body = {
            "model": await self.model_name(url),
            "prompt": ids,
            "max_tokens": 1,
            "n": 1,
            "prompt_logprobs": 0,
            "temperature": 0.0,
        }
        status, raw = await self._send("POST", f"{url}/v1/completions", json=body)
        return parse_prompt_logprobs(self._answer(url, status, raw, ids), ids, url)
