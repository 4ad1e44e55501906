"""``SandboxPool``: at most N runs at once, warm sandboxes reused, lifetimes bounded, metrics kept.

A run waits for one of ``max_concurrency`` slots (that wait is ``queue_wait``), takes an idle
sandbox or creates one, runs, and hands the sandbox back. A sandbox is retired (closed, never
reused) when it has served ``max_uses_per_sandbox`` runs, has lived ``max_lifetime_s``, or raised
an infrastructure error. A run that fails with an infrastructure error (the sandbox failed, not the
program) goes again on another sandbox, ``infra_retries`` times, after a backoff from
``retry_backoff_s``; a provider that fails ``breaker_after`` runs in a row is taken for down and
runs fail at once for ``breaker_cooldown_s`` (``_breaker``). What "warm" buys depends on the
provider: for a remote provider it is a booted machine; for ``LocalSandbox`` it is only the
prepared bubblewrap command line, since every local run gets fresh namespaces anyway.

Given a *stateless* sandbox object (``LocalSandbox()``) instead of a factory, the pool shares
that one object among all runs and never closes it; uses and lifetime limits then do not apply.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self, cast

import structlog

from telescope_sandbox._breaker import Breaker, backoff_s
from telescope_sandbox._errors import (
    SandboxInfraError,
    SandboxProviderDownError,
    SandboxRequestError,
    SandboxUnavailableError,
)
from telescope_sandbox._provider import Sandbox
from telescope_sandbox._result import ExecResult

__all__ = ["SandboxFactory", "SandboxPool"]

SandboxFactory = Callable[[], Sandbox | Awaitable[Sandbox]]
"""Makes one sandbox: a provider class such as ``LocalSandbox`` or any (async) callable."""

_log = structlog.get_logger()
_WINDOW = 10_000


@dataclass
class _Slot:
    sandbox: Sandbox
    created: float
    uses: int = 0


def _quantile(samples: Sequence[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SandboxPool:
    """Runs programs through a bounded set of sandboxes. Use ``async with``; ``run`` as ``Sandbox.run``.

    ``provider`` is a factory (``LocalSandbox``, ``lambda: LocalSandbox(limits=...)``, an async
    function) or one stateless sandbox object to share. ``max_uses_per_sandbox`` and
    ``max_lifetime_s`` (None: unlimited) retire sandboxes; ``metrics()`` reports counts and
    timings.
    """

    def __init__(
        self,
        provider: SandboxFactory | Sandbox | None = None,
        *,
        max_concurrency: int = 8,
        max_uses_per_sandbox: int | None = None,
        max_lifetime_s: float | None = None,
        infra_retries: int = 2,
        retry_backoff_s: float = 0.5,
        breaker_after: int = 10,
        breaker_cooldown_s: float = 30.0,
    ) -> None:
        if max_concurrency < 1:
            raise SandboxRequestError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_uses_per_sandbox is not None and max_uses_per_sandbox < 1:
            raise SandboxRequestError(
                f"max_uses_per_sandbox must be >= 1 or None, got {max_uses_per_sandbox}"
            )
        if max_lifetime_s is not None and max_lifetime_s <= 0:
            raise SandboxRequestError(f"max_lifetime_s must be > 0 or None, got {max_lifetime_s}")
        if infra_retries < 0 or retry_backoff_s < 0 or breaker_after < 1 or breaker_cooldown_s < 0:
            raise SandboxRequestError(
                "infra_retries and retry_backoff_s must be >= 0, breaker_after >= 1 and breaker_cooldown_s "
                f">= 0; got {infra_retries}, {retry_backoff_s}, {breaker_after}, {breaker_cooldown_s}"
            )
        self.infra_retries, self.retry_backoff_s = infra_retries, retry_backoff_s
        self.breaker = Breaker(breaker_after, breaker_cooldown_s)
        if provider is None:
            from telescope_sandbox._local import LocalSandbox

            provider = LocalSandbox
        self._shared: Sandbox | None = None
        self._factory: SandboxFactory | None = None
        if isinstance(provider, Sandbox):
            if not provider.stateless:
                raise SandboxRequestError(
                    f"{type(provider).__name__} keeps state between runs; pass a factory (its class) instead"
                )
            self._shared = provider
        else:
            self._factory = provider
        self.max_concurrency = max_concurrency
        self.max_uses_per_sandbox = max_uses_per_sandbox
        self.max_lifetime_s = max_lifetime_s
        self._slots = asyncio.Semaphore(max_concurrency)
        self._idle: deque[_Slot] = deque()
        self._closed = False
        self._counts: Counter[str] = Counter()
        self._queue_wait: deque[float] = deque(maxlen=_WINDOW)
        self._run_time: deque[float] = deque(maxlen=_WINDOW)
        self._queue_wait_sum = 0.0
        self._run_time_sum = 0.0
        self._in_flight = 0
        self._max_in_flight = 0

    # -- leasing ---------------------------------------------------------------------------------

    async def _create(self) -> _Slot:
        assert self._factory is not None
        made = self._factory()
        sandbox = await made if inspect.isawaitable(made) else made
        if not isinstance(cast(object, sandbox), Sandbox):  # the factory is the caller's code
            raise SandboxRequestError(f"the pool's factory returned {type(sandbox).__name__}, not a Sandbox")
        self._counts["created"] += 1
        return _Slot(sandbox, time.monotonic())

    def _expired(self, slot: _Slot) -> bool:
        if self.max_uses_per_sandbox is not None and slot.uses >= self.max_uses_per_sandbox:
            return True
        return self.max_lifetime_s is not None and time.monotonic() - slot.created >= self.max_lifetime_s

    async def _retire(self, slot: _Slot) -> None:
        self._counts["retired"] += 1
        try:
            await slot.sandbox.close()
        except Exception as exc:  # a sandbox that fails to close must not fail the run
            _log.warning("sandbox_close_failed", error=repr(exc))

    @asynccontextmanager
    async def sandbox(self) -> AsyncGenerator[Sandbox, None]:
        """Lease one sandbox for several runs (files persist between them on stateful providers)."""
        if self._closed:
            raise SandboxRequestError("the sandbox pool is closed")
        waited = time.monotonic()
        async with self._slots:
            wait = time.monotonic() - waited
            self._queue_wait.append(wait)
            self._queue_wait_sum += wait
            if self._closed:
                raise SandboxRequestError("the sandbox pool is closed")
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            try:
                if self._shared is not None:
                    yield self._shared
                    return
                slot = None
                while self._idle:
                    candidate = self._idle.popleft()
                    if self._expired(candidate):
                        await self._retire(candidate)
                    else:
                        slot = candidate
                        break
                if slot is None:
                    try:
                        slot = await self._create()
                    except Exception:
                        self._counts["failures"] += 1
                        raise
                healthy = False
                try:
                    yield slot.sandbox
                    healthy = True
                except SandboxInfraError:
                    raise
                except Exception:
                    healthy = True
                    raise
                finally:
                    slot.uses += 1
                    if healthy and not self._closed and not self._expired(slot):
                        self._idle.append(slot)
                    else:
                        await self._retire(slot)
            finally:
                self._in_flight -= 1

    # -- running ---------------------------------------------------------------------------------

    async def _timed(self, call: Callable[[Sandbox], Awaitable[ExecResult]]) -> ExecResult:
        """One run, again on another sandbox after an infrastructure error (see the module)."""
        attempt = 0
        while True:
            if (left := self.breaker.check()) is not None:
                self._counts["fast_failed"] += 1
                raise SandboxProviderDownError(
                    f"the sandbox provider looks down: {self.breaker.failures} runs in a row failed on "
                    f"infrastructure errors (last: {self.breaker.last_error}); runs fail at once for "
                    f"{left:.0f} s more, then one tries it again"
                )
            try:
                result = await self._timed_once(call)
            except SandboxUnavailableError:  # this host cannot run it at all: no retry helps
                raise
            except SandboxInfraError as exc:
                attempt += 1
                if attempt > self.infra_retries:
                    self.breaker.failed(f"{type(exc).__name__}: {str(exc)[:500]}")
                    raise
                self._counts["infra_retries"] += 1
                _log.warning("sandbox_infra_retry", attempt=attempt, error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(backoff_s(attempt, self.retry_backoff_s))
                continue
            self.breaker.succeeded()
            return result

    async def _timed_once(self, call: Callable[[Sandbox], Awaitable[ExecResult]]) -> ExecResult:
        async with self.sandbox() as sandbox:
            started = time.monotonic()
            try:
                result = await call(sandbox)
            except SandboxRequestError:
                self._counts["bad_requests"] += 1
                raise
            except Exception:
                self._counts["failures"] += 1
                raise
            finally:
                elapsed = time.monotonic() - started
                self._run_time.append(elapsed)
                self._run_time_sum += elapsed
            self._counts["runs"] += 1
            if result.killed_by is not None:
                self._counts[f"killed_by_{result.killed_by}"] += 1
            return result

    async def run(self, code: str, **kwargs: Any) -> ExecResult:
        """``Sandbox.run`` on a pooled sandbox; same arguments and result."""
        return await self._timed(lambda sandbox: sandbox.run(code, **kwargs))

    async def run_command(self, argv: Sequence[str], **kwargs: Any) -> ExecResult:
        """``Sandbox.run_command`` on a pooled sandbox; same arguments and result."""
        return await self._timed(lambda sandbox: sandbox.run_command(argv, **kwargs))

    # -- metrics and lifecycle -------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Counts and timings since creation; percentiles over the last 10,000 runs.

        Keys: ``runs`` (finished, any exit), ``failures`` (infrastructure errors, each attempt),
        ``infra_retries`` (attempts made again), ``fast_failed`` (runs failed at once while the
        provider looked down), ``breaker_opened`` (times it was taken for down), ``bad_requests``,
        ``killed_by_<limit>``, ``created`` / ``retired`` (sandboxes),
        ``idle``, ``in_flight``, ``max_in_flight``, and ``queue_wait_s_{sum,p50,p99,max}``,
        ``run_time_s_{sum,p50,p99,max}``.
        """
        out: dict[str, float] = {
            key: float(self._counts[key])
            for key in (
                "runs",
                "failures",
                "infra_retries",
                "fast_failed",
                "bad_requests",
                "created",
                "retired",
            )
        }
        out["breaker_opened"] = float(self.breaker.opened)
        out |= {key: float(n) for key, n in self._counts.items() if key.startswith("killed_by_")}
        out |= {
            "idle": float(len(self._idle)),
            "in_flight": float(self._in_flight),
            "max_in_flight": float(self._max_in_flight),
        }
        for name, samples, total in (
            ("queue_wait_s", self._queue_wait, self._queue_wait_sum),
            ("run_time_s", self._run_time, self._run_time_sum),
        ):
            out[f"{name}_sum"] = total
            out[f"{name}_p50"] = _quantile(samples, 0.50)
            out[f"{name}_p99"] = _quantile(samples, 0.99)
            out[f"{name}_max"] = max(samples, default=0.0)
        return out

    async def aclose(self) -> None:
        """Close every idle sandbox; leased ones close when returned. Later runs raise."""
        self._closed = True
        while self._idle:
            await self._retire(self._idle.popleft())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
