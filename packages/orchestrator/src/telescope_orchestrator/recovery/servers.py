"""Inference servers that die are restarted, rejoin weight sync and get the current weights before
they serve again (docs/troubleshooting.md, "An inference server dies").

A server counts as dead when its vLLM process has exited, when ``/health`` or a probe through its
engine (a stuck engine core still lets ``/health`` answer) has failed for
``inference_health_timeout_seconds`` in a row, when a request finds it unreachable (the engine's
``on_server_down``), when its engine does not answer within ``weight_broadcast_timeout_s`` before
a weight update, or when an update fails and it did not apply it (vLLM's in-place reload that
breaks off leaves a half-loaded model). Then, in order:

1. the engine takes it out of the pool (``server_lost``): its unfinished groups are cancelled
   with reason ``server_restart`` and their prompts generated again on the other servers;
2. the next weight update first forms the weight-sync groups without it;
3. its actor restarts vLLM on the same port, at most ``inference_max_restarts`` times;
4. holding :attr:`ServerSupervisor.lock` (no training step or update meanwhile, so the trainer
   holds the weights of the pool's version), the groups are formed with it again plus a group
   ``restart`` of it alone, the trainer sends it those weights, and the engine takes it back
   (``server_back``).

A server past its restarts stays out and the run goes on with a warning; once no server is left,
the engine fails with :class:`ServersGone` (the loop checkpoints, then the run stops naming the
server, its log and the fix). Each transition is an event of the run record and a console line;
``restarts/inference`` in the step metrics counts restarts since the run started.

The servers of the teacher and the reference model (``scorer_servers``) are watched and restarted
the same way, without weights to send (they never change): a dead one is taken out of its scorer
(``ServedScorer.server_lost``: its requests go to the model's other servers, or wait), restarted,
and put back (``server_back``); its scorer reports a server it finds unreachable. Once every server
of one of these models is given up, the engine fails with :class:`ServersGone` too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import structlog

from telescope_orchestrator.cluster.calls import actor_cause
from telescope_orchestrator.cluster.reaper import describe_exit
from telescope_rollout import RolloutError

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig
    from telescope_rollout import RolloutEngine

__all__ = ["RESTART_GROUP", "ServerSupervisor", "ServersGone"]

log = structlog.get_logger()

RESTART_GROUP = "restart"
"""The weight-sync group of a restarted server alone, for the weights it has missed."""
POLL_S = 2.0
"""How often each server's process and ``/health`` are checked."""
RETRY_S = 5.0
"""Pause before another restart of a server whose restart failed."""
PROBE_TIMEOUT_S = 10.0
"""How long a running server's engine has to answer the watcher's probe (a failure counts
towards ``inference_health_timeout_seconds``); before and after a weight update the probe has
``weight_broadcast_timeout_s``."""


class ServersGone(RolloutError):
    """No inference server is left: every one died more often than ``inference_max_restarts``."""


@dataclass
class _Server:
    url: str
    actor: Any
    restarts: int = 0
    state: str = "up"
    """``up``; ``out`` (dead, being restarted); ``given_up`` (past its restarts)."""
    failing_since: float | None = None
    """When ``/health`` started failing (None: it answers)."""
    scorer: Any = None
    """The ``ServedScorer`` of a teacher's or reference model's server (None: a policy server)."""

    @property
    def what(self) -> str:
        """The server's kind in messages: ``inference``, ``teacher`` or ``ref``."""
        return "inference" if self.scorer is None else str(self.scorer.name)


@dataclass(frozen=True)
class SupervisorLimits:
    """How long the supervisor waits and how often it restarts (fields of the run config)."""

    max_restarts: int
    """``inference_max_restarts``: restarts of one server before it stays out."""
    health_timeout_s: float
    """``inference_health_timeout_seconds``: failing health checks in a row before a server is dead."""
    start_timeout_s: float
    """``ray_placement_timeout_s``: a restarted server's time to answer ``/health``."""
    update_timeout_s: float
    """``weight_broadcast_timeout_s``: a server's engine's time to answer before a weight update."""

    @classmethod
    def from_config(cls, cfg: TelescopeConfig) -> SupervisorLimits:
        """The limits of the run config ``cfg``."""
        return cls(
            max_restarts=int(cfg.inference_max_restarts),
            health_timeout_s=float(cfg.inference_health_timeout_seconds),
            start_timeout_s=float(cfg.ray_placement_timeout_s),
            update_timeout_s=float(cfg.weight_broadcast_timeout_s),
        )


class ServerSupervisor:
    """Watches the run's vLLM servers and restarts those that die (see the module docstring).

    ``event(kind, **detail)`` records a transition, ``say(text)`` shows it; ``trainers_dead()``
    says which trainer ranks died (``recovery.trainers.dead_ranks``): a failed update or forming
    with a dead rank is the trainer's failure, not the servers' (the loop restarts the ranks);
    ``on_lost(url)`` is told of each server lost (``EvalRunner.server_lost``: an eval under way
    sends it nothing more, since back it holds newer weights than the step the eval measures);
    ``on_restarted(actor)`` of each server actor whose vLLM was restarted (blocking, run in a
    thread: the infrastructure sampler takes its new pid).
    """

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        servers: Sequence[tuple[str, Any]],
        trainers: Sequence[Any],
        groups: dict[str, list[str]],
        limits: SupervisorLimits,
        event: Callable[..., None],
        say: Callable[[str], None],
        trainers_dead: Callable[[], Awaitable[dict[int, str]]] | None = None,
        on_lost: Callable[[str], None] | None = None,
        on_restarted: Callable[[Any], None] | None = None,
        scorer_servers: Sequence[tuple[str, Any, Any]] = (),
    ) -> None:
        self.engine = engine
        self.servers = {url: _Server(url, actor) for url, actor in servers}
        for url, actor, scorer in scorer_servers:  # (url, actor, its ServedScorer)
            self.servers[url] = _Server(url, actor, scorer=scorer)
            scorer.on_server_down = self._report
        self.trainers = list(trainers)
        self.groups = {name: list(members) for name, members in groups.items()}
        self.connected = {name: list(members) for name, members in groups.items()}
        """The weight-sync groups as last formed ({}: unknown, form them before the next update)."""
        self.max_restarts = limits.max_restarts
        self.health_timeout_s = limits.health_timeout_s
        self.start_timeout_s = limits.start_timeout_s
        self.update_timeout_s = limits.update_timeout_s
        self.event, self.say = event, say
        self.lock = asyncio.Lock()
        """Held by the loop from a training step through its weight update, and by a resync."""
        self.restarts = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http: httpx.AsyncClient | None = None
        self._closed = False
        self.trainers_dead, self.on_lost, self.on_restarted = trainers_dead, on_lost, on_restarted
        engine.on_server_down = lambda url, error: self._spawn(self._reported(url, error))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._http = httpx.AsyncClient()
        self._spawn(self._watch(), name="server-watch")

    async def close(self) -> None:
        self._closed = True  # the engine may still report servers while the run stops: no restarts
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    @property
    def restarting(self) -> bool:
        """A dead server is being started again (it loads and warms up its model on its cores)."""
        return any(s.state == "out" for s in self.servers.values())

    def metrics(self) -> dict[str, float]:
        out = sum(s.state != "up" for s in self.servers.values())
        return {"restarts/inference": float(self.restarts), "servers/out": float(out)}

    def _spawn(self, coro: Any, name: str | None = None) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error(
                "server supervision task failed", task=task.get_name(), error=f"{type(exc).__name__}: {exc}"
            )

    # ------------------------------------------------------------------ weight updates
    def groups_now(self, back: str | None = None) -> dict[str, list[str]]:
        """The configured groups without the servers that are out (``back``: one coming back)."""
        up = {u for u, s in self.servers.items() if s.state == "up" or u == back}
        kept = {name: [u for u in members if u in up] for name, members in self.groups.items()}
        return {name: members for name, members in kept.items() if members}

    async def _form(self, groups: dict[str, list[str]]) -> None:
        self.connected = {}
        if groups:  # none: no server is up, nothing to form until one is back
            await asyncio.gather(*[a.reconnect_weights.remote(groups) for a in self.trainers])
        self.connected = groups

    async def publish(self, step: int, group: str) -> tuple[dict[str, float], list[str]]:
        """Send step ``step``'s weights to ``group``'s servers that are up (hold :attr:`lock`);
        returns the sender's metrics and the servers that got them.

        First every member must answer a probe through its engine (a stuck one is lost before it
        can stall the update). A failed update probes them again: those that exited, do not answer
        or did not apply it (vLLM's in-place reload that breaks off leaves layers on the meta
        device) are lost and restarted in the background, and the update goes again to the others.
        """
        for url, why in (await self._probe(self.groups_now().get(group, []))).items():
            await self.lose(url, f"before weight update {step}: {why}")
        for attempt in range(len(self.servers) + 1):
            members = self.groups_now().get(group, [])
            if not members:
                return {}, []
            if await self._formed(self.groups_now(), f"weight update {step}", retry=not attempt):
                continue
            try:
                sync = await asyncio.gather(*[a.publish.remote(step, group) for a in self.trainers])
                return sync[0] or {}, members
            except Exception as exc:
                error = f"{type(actor_cause(exc)).__name__}: {actor_cause(exc)}"
                self.connected = {}  # a failed update drops its group
                if await self._trainer_died():
                    raise
                dead = await self._probe(members, version=step)
                log.warning("weight update failed", step=step, group=group, error=error, dead=dead)
                if not dead and attempt:
                    raise
                for url, why in dead.items():
                    await self.lose(url, f"weight update {step} failed: {why} ({error[:300]})")
        raise RuntimeError(f"weight update {step} failed on every attempt")  # pragma: no cover

    async def _formed(self, groups: dict[str, list[str]], what: str, *, retry: bool) -> dict[str, str]:
        """Form ``groups`` unless they are; ``{}`` when they are formed, else the dead servers
        found (those up are lost: form again) or, with none found, ``{"": error}`` when ``retry``
        (else that raises). No weights moved: no version to check."""
        if self.connected == groups:
            return {}
        try:
            await self._form(groups)
            return {}
        except Exception as exc:
            error = f"{type(actor_cause(exc)).__name__}: {actor_cause(exc)}"
            if await self._trainer_died():
                raise
            dead = await self._probe(sorted({u for ms in groups.values() for u in ms}), any_state=True)
            log.warning("forming the weight-sync groups failed", before=what, error=error, dead=dead)
            if not dead and not retry:
                raise
            for url, why in dead.items():
                await self.lose(url, f"forming the weight-sync groups before {what} failed: {why}")
            return dead or {"": error}

    async def _trainer_died(self) -> bool:
        return self.trainers_dead is not None and bool(await self.trainers_dead())

    async def _probe(
        self, urls: list[str], version: int | None = None, *, any_state: bool = False
    ) -> dict[str, str]:
        """Why each server among ``urls`` is dead, for those that are: out of the pool (unless
        ``any_state``), its process exited, its engine does not answer, or (``version`` given) it
        does not serve ``version``."""
        from telescope_weightsync import probe_version

        async def why(url: str) -> str | None:
            server = self.servers[url]
            if server.state != "up" and not any_state:
                return "out of the pool"
            exited = await self._exited(server)
            if exited is not None:
                return exited
            try:
                served = await probe_version(self._client(), url, timeout_s=self.update_timeout_s)
            except Exception as exc:
                return f"its engine does not answer ({type(exc).__name__}: {str(exc)[:200]})"
            if version is not None and served != version:
                return f"it serves weights {served}, not {version} (its reload broke off)"
            return None

        found = await asyncio.gather(*[why(u) for u in urls])
        return {u: w for u, w in zip(urls, found, strict=True) if w is not None}

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient()
        return self._http

    async def _exited(self, server: _Server) -> str | None:
        """Why ``server``'s process is gone (it exited, or its Ray actor does not answer), else None."""
        try:
            code = await server.actor.exit_code.remote()
        except Exception as exc:  # its Ray actor is gone (a dead node): restarting it will say so
            return f"its actor does not answer ({type(actor_cause(exc)).__name__}: {actor_cause(exc)})"
        return None if code is None else f"its vLLM process {describe_exit(code)}"

    # ------------------------------------------------------------------ death and restart
    def _report(self, url: str, error: str) -> None:
        """A scorer found ``url`` unreachable (``ServedScorer.on_server_down``)."""
        self._spawn(self._reported(url, error))

    async def _reported(self, url: str, error: str) -> None:
        """A request found ``url`` unreachable (the engine took it out): dead, or a passing blip."""
        engine, server = self.engine, self.servers[url]
        if server.state != "up":
            return
        if server.scorer is not None:  # frozen: its process and /health say it all
            alive = await self._exited(server) is None and await self._unresponsive(url, engine=False) is None
            if server.state != "up":  # lost meanwhile (the watcher found it dead): its restart decides
                return
            if alive:
                log.warning("scorer server unreachable for a moment; it answers now", server=url, error=error)
                self.event("server_blip", server=url, error=error[:2000], what=server.what)
                server.scorer.server_back(url)
                return
        elif not await self._probe([url]) and engine.server_versions[url] == engine.version:
            log.warning("inference server unreachable for a moment; it answers now", server=url, error=error)
            self.event("server_blip", server=url, error=error[:2000])
            engine.server_back(url, engine.version)
            return
        await self.lose(url, f"unreachable: {error}")

    async def lose(self, url: str, reason: str) -> None:
        """``url`` is dead: out of the pool, then restarted in the background (or given up)."""
        server = self.servers[url]
        if server.state != "up":
            return
        server.state = "out"
        log.error(f"{server.what} server died", server=url, reason=reason, restarts=server.restarts)
        self.event("server_down", server=url, reason=reason, restarts=server.restarts, what=server.what)
        if server.scorer is not None:
            server.scorer.server_lost(url)
            meanwhile = f"its requests go to the {server.what} model's other servers or wait"
        else:
            await self.engine.server_lost(url)
            if self.on_lost is not None:
                self.on_lost(url)
            meanwhile = "its unfinished groups are generated again"
        if server.restarts >= self.max_restarts:
            await self._give_up(server, reason)
            return
        self.say(
            f"[yellow]{server.what} server {url} died[/yellow] ({reason[:200]}); {meanwhile}; "
            f"restarting it ({server.restarts + 1}/{self.max_restarts})"
        )
        self._spawn(self._restart(server), name=f"restart-{url}")

    async def _restart(self, server: _Server) -> None:
        while True:
            server.restarts += 1
            self.restarts += 1
            t0 = time.monotonic()
            self.event("server_restarting", server=server.url, attempt=server.restarts, what=server.what)
            try:
                await server.actor.restart.remote(self.start_timeout_s)
                version = await self._resync_soon(server) if server.scorer is None else None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = f"{type(actor_cause(exc)).__name__}: {str(actor_cause(exc))[:2000]}"
                log.error("inference server restart failed", server=server.url, error=error)
                attempt = server.restarts
                self.event(
                    "server_restart_failed", server=server.url, attempt=attempt, error=error, what=server.what
                )
                if server.scorer is None:  # it may have joined the weight-sync groups before it failed
                    self.connected = {}
                if server.restarts >= self.max_restarts:
                    await self._give_up(server, error)
                    return
                await asyncio.sleep(RETRY_S)
                continue
            seconds = time.monotonic() - t0
            if server.scorer is not None:
                server.state, server.failing_since = "up", None
                server.scorer.server_back(server.url)
            if self.on_restarted is not None:
                await asyncio.to_thread(self.on_restarted, server.actor)
            log.info(
                "server back", server=server.url, what=server.what, version=version, seconds=round(seconds)
            )
            self.event(
                "server_restarted",
                server=server.url,
                attempt=server.restarts,
                version=version,
                seconds=seconds,
                what=server.what,
            )
            held = f"weights of step {version}" if version is not None else "its model never changes"
            self.say(f"{server.what} server {server.url} is back ({seconds:.0f} s, {held})")
            return

    async def _resync_soon(self, server: _Server) -> int:
        """:meth:`_resync`, again while the groups fail to form because *other* servers died (they
        are lost meanwhile); raises when ``server`` itself is the trouble."""
        for _ in range(len(self.servers) + 1):
            version = await self._resync(server)
            if version is not None:
                return version
        raise RuntimeError("the weight-sync groups did not form with it")

    async def _resync(self, server: _Server) -> int | None:
        """Groups with ``server`` again, the pool's weights sent to it, then back in the pool;
        None when the groups did not form because of other servers (lost now: try again)."""
        async with self.lock:
            version = int(self.engine.version)
            groups = self.groups_now(back=server.url)
            dead = await self._formed(
                {**groups, RESTART_GROUP: [server.url]}, f"the resync of {server.url}", retry=True
            )
            if server.url in dead or "" in dead:
                raise RuntimeError(
                    f"it did not join the weight-sync groups: {dead.get(server.url) or dead['']}"
                )
            if dead:
                return None
            await asyncio.gather(*[a.publish.remote(version, RESTART_GROUP) for a in self.trainers])
            await asyncio.gather(*[a.disconnect_weights.remote(RESTART_GROUP) for a in self.trainers])
            self.connected = groups
            server.state, server.failing_since = "up", None
            self.engine.server_back(server.url, version)
        return version

    async def _give_up(self, server: _Server, reason: str) -> None:
        server.state = "given_up"
        logs = "logs/inference/" if server.scorer is None else f"logs/{server.what}/"
        what = f"{server.what} server {server.url} died {server.restarts + 1} time(s), last: {reason[:300]}"
        try:
            report = await server.actor.failure_report.remote(what)
        except Exception:  # its actor is gone too
            report = f"{what}. Its log: {logs} in the run directory"
        self.event(
            "server_given_up",
            server=server.url,
            restarts=server.restarts,
            reason=reason[:2000],
            what=server.what,
        )
        peers = [s for s in self.servers.values() if s.scorer is server.scorer]
        if all(s.state == "given_up" for s in peers):
            gone = ServersGone(
                f"no {server.what} server is left: {report}\nFix the cause above, then resume the run "
                "with --resume_from_checkpoint true (raise inference_max_restarts for a flaky machine)."
            )
            if server.scorer is not None:
                server.scorer.fail(gone)  # its waiting requests end
            self.engine.fail(gone)
            return
        log.warning(f"{server.what} server given up", server=server.url, report=report)
        self.say(
            f"[yellow]warning[/yellow]: {server.what} server {server.url} is given up after "
            f"{server.restarts} restart(s) (inference_max_restarts); training goes on without it. "
            f"Its log: {logs}"
        )

    # ------------------------------------------------------------------ watching
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                up = [s for s in self.servers.values() if s.state == "up"]
                reasons = await asyncio.gather(*[self._check(s) for s in up])
                for server, reason in zip(up, reasons, strict=True):
                    if reason is not None:
                        await self.lose(server.url, reason)
            except Exception as exc:  # one bad round must not end the watching
                log.error("server watch failed", error=f"{type(exc).__name__}: {exc}")

    async def _check(self, server: _Server) -> str | None:
        """Why ``server`` is dead (its process exited, or ``/health`` or its engine failing for
        ``inference_health_timeout_seconds``), else None."""
        exited = await self._exited(server)
        if exited is not None:
            return exited
        asked = time.monotonic()
        # the engine of a teacher's or reference model's server has no weight receiver to probe
        failing = await self._unresponsive(server.url, engine=server.scorer is None)
        now = time.monotonic()
        if failing is None:
            server.failing_since = None
            return None
        # failing since the check that found it began: a probe waits up to PROBE_TIMEOUT_S, and
        # counting from its end found a hung engine 33 s after it stopped with a 15 s timeout
        server.failing_since = server.failing_since or asked
        if now - server.failing_since >= self.health_timeout_s:
            return f"{failing} for {now - server.failing_since:.0f} s"
        return None

    async def _unresponsive(self, url: str, *, engine: bool = True) -> str | None:
        """What fails on a running server: ``/health``, or (``engine``) its engine (a stuck engine
        core still lets ``/health`` answer), else None."""
        from telescope_weightsync import probe_version

        try:
            if (await self._client().get(f"{url}/health", timeout=5.0)).status_code != 200:
                return "/health failed"
        except httpx.HTTPError:
            return "/health failed"
        if not engine or self.lock.locked():
            # a step or a weight update is under way: the engine runs an update's calls one at a
            # time, so a probe would wait behind them (a stuck engine is found before the update)
            return None
        try:
            await probe_version(self._client(), url, timeout_s=min(PROBE_TIMEOUT_S, self.health_timeout_s))
        except Exception:
            return "its engine did not answer"
        return None
