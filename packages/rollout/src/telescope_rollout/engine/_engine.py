"""The async rollout engine: lanes, dispatch, off-policy control, group acceptance.

How it schedules, in prose: docs/rollout.md, "The engine".

``async with RolloutEngine(...) as engine:`` starts a dispatch loop that keeps every server's lane
slots busy with groups of ``group_size`` samples (and waits while more samples wait for their
rewards or scores than the servers have slots); ``await engine.next_batch()`` returns the next
``RolloutBatch`` of ``prompts_batch_size_for_trainer`` kept groups; ``engine.weights_updated(v)``
announces that weight version ``v`` is live on the servers.

Draining (periodic evals): ``await engine.drain_servers(urls)`` takes servers out of the
training pool: nothing new is dispatched to them and their groups still using the server are
cancelled (reason ``eval_drain``); ``engine.restore_servers(urls)`` gives them back once they hold
the pool's weights again. While drained, a server may keep an older version: updates name the
servers that got them (``weights_updated(v, servers=...)``), every server in the pool must be
among them, and a sample's versions are those of the server it ran on. Every request carries
the prefix-cache salt of its server's version when it is sent (``inference.cache_salt``), so
vLLM never reuses a prompt prefix computed under older weights (docs/rollout.md, "Prefix caching
and weight updates").

Supervision (servers restarted by the caller): when ``on_server_down(url, error)`` is set, a
server found unreachable is reported to it (once, until it is back) and the engine never stops
because every server is down: the caller restarts servers. ``await engine.server_lost(url)``
takes a dead server out of the pool: its groups that still need it are cancelled (reason
``server_restart``) and their prompts queued again (same prompt, fresh samples);
``engine.server_back(url, version)`` puts it back once it holds the pool's weights.

Counters (version v = number of weight updates applied, 0 = base model; step = batches assembled):
- pause: no new group starts while ``step - v > max_async_rollout`` (resumes on an update);
- staleness of a group = the step it lands in minus the oldest version its samples *started*
  under; above ``max_async_rollout`` it is discarded (``max_async``). Counting from the start,
  a sample begun long ago is never taken for fresh because it finished after a late update. A
  group still generating whose staleness already exceeds the limit when a batch is assembled is
  cancelled at once (``max_async``) instead of finishing only to be dropped;
- every update adds one to ``off_policy_steps`` of each sample still generating; a group with a
  sample above ``max_off_policy_steps`` is cancelled at once (``off_policy``).
Acceptance, in order: any error drops the group (reason = the error kind), then ``max_async``,
then ``zero_advantage``; otherwise it is kept. Dropped and cancelled groups ride along in the next
batch for inspection, at most ``4 * prompts_batch_size_for_trainer + 64`` of each per batch (the
first ones; the rest are counted in ``rollout/discarded_unrecorded`` / ``rollout/cancelled_unrecorded``).

Input that can only fail again stops the run with a :class:`RolloutError`: an environment whose
prompts cannot fit the context, a run of groups that all failed with one error kind, a run of
groups dropped for zero advantage (an environment alone in that state is named in a warning,
event ``environment_flat``); the rules and their counts: ``engine._watch`` and docs/rollout.md,
"Input that can only fail again".

Progress: ``progress()`` is the batch being filled as it stands (kept of needed, drops by reason,
the rewards of finished groups per environment) and ``pending_drops()`` the groups dropped for it
so far, for a caller that reports while it waits (they still ride along in the batch).

Teachers and reference models: each of ``scorers`` (``inference.TokenScorer``, named ``teacher``
or ``ref``) scores every sequence of a sample once it has its reward, while other samples still
generate: ``ScoredSample.teacher_logprobs`` / ``ref_logprobs`` (and those of its
``extra_sequences``). A scorer that fails fails the sample (``scoring_error``, with the server's
answer), like any other sample error.

Events: ``on_event(EngineEvent)``, when given, hears what the orchestrator's timeline needs
(dispatch paused/resumed, batch assembled, group cancelled, servers drained/restored, weights
updated; see :class:`EngineEvent`). It runs inline, so it must be quick; one that raises is
logged once and otherwise ignored.

All methods must be called from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog

from telescope_rollout.engine._bucket import Bucket, batch_metrics
from telescope_rollout.engine._episode import Play, completion_budget, play_sample, system_prompt_of, too_long
from telescope_rollout.engine._groups import (
    AdvantageFn,
    GroupRun,
    RewardShaping,
    SampleRun,
    is_zero_advantage,
    score_advantages,
    scored_group,
)
from telescope_rollout.engine._pool import ServerPool
from telescope_rollout.engine._progress import BatchProgress
from telescope_rollout.engine._prompts import PreparedPrompt, PromptSource
from telescope_rollout.engine._results import (
    DroppedGroup,
    EngineEvent,
    RolloutBatch,
    ScoredGroup,
    ScoredSample,
    TrainingSequence,
)
from telescope_rollout.engine._sampler import MultiEnvSampler
from telescope_rollout.engine._settings import EngineSettings
from telescope_rollout.engine._tokens import TokenArray
from telescope_rollout.engine._watch import (
    FailureWatch,
    flat_environment_message,
    flat_run_message,
    same_error_message,
    unfit_message,
)
from telescope_rollout.envs._env import Environment, environments_by_name, maybe_await
from telescope_rollout.gateway import AgentGateway
from telescope_rollout.inference._client import CompletionClient, InferenceError, ServerUnavailableError
from telescope_rollout.inference._scorer import TokenScorer

log = structlog.get_logger()


DISPATCH_SLICE_S = 0.005
"""The longest the dispatch loop starts groups before it lets the event loop run the rest (the
samples it started, the answers that came back): 256 servers' groups at once held it 0.2-0.3 s."""
SCORER_NAMES = ("teacher", "ref")
"""The token scorers a run can have: its teacher (on-policy distillation) and its reference model."""


def _checked_scorers(scorers: Sequence[TokenScorer]) -> list[TokenScorer]:
    """The engine's scorers: at most one of each of :data:`SCORER_NAMES`."""
    names = [scorer.name for scorer in scorers]
    if sorted(set(names)) != sorted(names) or not set(names) <= set(SCORER_NAMES):
        raise ValueError(f"scorers are named {names}: at most one of each of {', '.join(SCORER_NAMES)}")
    return list(scorers)


class RolloutError(RuntimeError):
    """The engine cannot go on (every server unreachable, input that can only fail, an internal failure)."""


def _store_scores(seq: ScoredSample | TrainingSequence, name: str, result: Any) -> str | None:
    """``result`` of scorer ``name`` as ``seq``'s ``<name>_logprobs`` (a :class:`TokenArray`: one
    logprob a completion token); what is wrong with it where it cannot be."""
    if isinstance(result, InferenceError):
        return f"the {name} model's server failed: {result}"
    if isinstance(result, Exception):  # a scorer's bug
        return f"the {name} scorer raised {type(result).__name__}: {result}"
    kind = type(result).__name__
    try:
        if isinstance(result, str | bytes | bytearray | memoryview):  # (an array would read raw bytes)
            raise TypeError("text or bytes")
        values = TokenArray.logprobs(result)
    except Exception as exc:  # anything a user's scorer may return
        return f"the {name} scorer returned {kind}, not a list of floats ({exc})"
    if len(values) != len(seq.completion_ids):
        return f"the {name} scorer returned {len(values)} logprobs for {len(seq.completion_ids)} tokens"
    setattr(seq, f"{name}_logprobs", values)
    return None


class RolloutEngine:
    """Generates scored groups from environments on inference servers; see the module docstring.

    ``environments``: ``{name: Environment}`` or the list ``build_environments`` returns (datasets
    loaded). ``sampler`` draws ``(name, index)``. ``tokenizer`` renders and tokenizes prompts.
    ``client``: an :class:`InferenceClient` (its ``server_urls`` are the servers).
    ``advantage_fn(rewards) -> advantages`` (required: the engine has no estimator of its own) gives
    each sample of a finished group its advantage; ``reward_shaping(sample) -> reward``, when given,
    replaces each sample's reward before that (e.g. an overlong penalty). Both run only for groups
    without errors; an exception from either stops the engine with a :class:`RolloutError`.
    ``scorers`` score each finished sample's tokens under a teacher / reference model (module
    docstring). ``clock`` (seconds) times the metrics; tests pass a fake one. ``on_event(EngineEvent)``, when
    given, is called on each timeline event (module docstring); None: no events.
    """

    _event_failed: bool = False
    """The ``on_event`` callback raised once (later failures are not logged)."""
    _paused_wall: float | None = None
    """Wall clock when dispatch last paused."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        environments: Mapping[str, Environment] | Sequence[Any],
        sampler: MultiEnvSampler,
        tokenizer: Any,
        client: CompletionClient,
        advantage_fn: AdvantageFn,
        reward_shaping: RewardShaping | None = None,
        scorers: Sequence[TokenScorer] = (),
        clock: Callable[[], float] | None = None,
        on_event: Callable[[EngineEvent], None] | None = None,
    ):
        self.scorers = _checked_scorers(scorers)
        self.settings = settings
        self.environments = environments_by_name(environments)
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.client = client
        self.advantage_fn = advantage_fn
        self.reward_shaping = reward_shaping
        self.clock = clock or time.monotonic
        self.on_event = on_event
        self.pool = ServerPool(list(client.server_urls), settings.lanes_per_server)
        """The servers: pool membership, the version each holds, lane slots (``engine._pool``)."""
        self.on_server_down: Callable[[str, str], None] | None = None
        """The caller's supervisor (module docstring): hears ``(url, error)`` of unreachable servers."""
        kwargs = {} if settings.enable_thinking is None else {"enable_thinking": settings.enable_thinking}
        buffer = settings.prompt_prefetch_buffer_size if settings.enable_prompt_prefetch else 0
        self.prompts = PromptSource(
            self.environments, sampler, tokenizer, buffer_size=buffer, chat_template_kwargs=kwargs
        )
        self.eos_token = settings.eos_token or getattr(tokenizer, "eos_token", None)
        self.version = self.step = self.next_group_id = self.next_sample_id = 0
        self.paused = False
        self._groups: dict[int, GroupRun] = {}
        self._batches: asyncio.Queue[RolloutBatch | BaseException] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.cancelled_groups = 0
        """Groups cancelled since the engine was built."""
        self.grading = 0
        """Samples past generation, their lane free, their reward or scores pending (``_grading_full``)."""
        self._paused_since: float | None = None
        self._last_batch_t = self.clock()
        P = settings.prompts_batch_size_for_trainer
        flat = settings.max_zero_advantage_batches * P if settings.discard_group_zero_advantage else 0
        self.watch = FailureWatch(settings.max_consecutive_unfit_prompts, max(2 * P, 8), flat)
        """Counts unfit prompts, same-error and zero-advantage groups (see the module docstring)."""
        self.gateway: AgentGateway | None = None
        """The agent gateway, started at the first agent episode (docs/rollout.md, "Agents")."""
        self._gateway_lock = asyncio.Lock()
        self.bucket = Bucket(P, max_recorded=4 * P + 64)
        """The batch being filled (``engine._bucket``): dropped and cancelled groups are kept per
        batch for records up to ``4 * prompts_batch_size_for_trainer + 64`` each; more are counted."""
        self._failed: RolloutError | None = None
        self._warned_unfit: set[str] = set()

    @property
    def servers(self) -> list[str]:
        """Every server of the engine, in order (``pool.servers``)."""
        return self.pool.servers

    @property
    def server_versions(self) -> dict[str, int]:
        """Weight version each server holds (``pool.versions``)."""
        return self.pool.versions

    # ----------------------------------------------------------------- events
    def _emit(self, kind: str, **detail: Any) -> None:
        """Hand ``on_event`` an :class:`EngineEvent`; a callback that raises is logged once, never fatal."""
        if self.on_event is None:
            return
        try:
            self.on_event(EngineEvent(kind, time.time(), self.step, detail))
        except Exception as exc:
            if not self._event_failed:
                self._event_failed = True
                log.warning(
                    "rollout_on_event_failed",
                    kind=kind,
                    error=f"{type(exc).__name__}: {exc}",
                    note="further failures of the on_event callback are not logged",
                )

    # ----------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> RolloutEngine:
        if self.settings.eager_prepare_resources:
            await self.prepare_resources()
        self.start()
        return self

    async def prepare_resources(self) -> None:
        """Await every environment's ``prepare_resources()`` (e.g. warm a sandbox pool), concurrently."""
        names = list(self.environments)
        results = await asyncio.gather(
            *(maybe_await(self.environments[n].prepare_resources()) for n in names), return_exceptions=True
        )
        failed = [(n, r) for n, r in zip(names, results, strict=True) if isinstance(r, BaseException)]
        if failed:
            detail = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in failed)
            raise RolloutError(f"prepare_resources() failed for environment(s) {detail}")

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start(self) -> None:
        """Start dispatching (``async with`` does it)."""
        if self._tasks:
            raise RuntimeError("the engine is already running")
        self._last_batch_t = self.clock()
        self._tasks.append(asyncio.create_task(self._dispatch_loop(), name="rollout-dispatch"))
        if self.prompts.buffer_size:
            self._tasks.append(asyncio.create_task(self.prompts.prefetch(), name="rollout-prefetch"))

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel dispatching and every group in flight; wait for them to unwind."""
        tasks = list(self._tasks)
        for g in list(self._groups.values()):
            tasks += g.tasks
            for t in g.tasks:
                t.cancel()
        self._groups.clear()
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        if self.gateway is not None:
            await self.gateway.aclose()
            self.gateway = None

    async def agent_gateway(self) -> AgentGateway:
        """The agent gateway, started on first use (agent environments' episodes are served there)."""
        async with self._gateway_lock:
            if self.gateway is None:
                gateway = AgentGateway()
                await gateway.start()
                self.gateway = gateway
            return self.gateway

    # ----------------------------------------------------------------- public API
    async def next_batch(self, timeout_s: float | None = 3600.0) -> RolloutBatch:
        """The next batch of kept groups; raises :class:`RolloutError` when the engine failed."""
        if not self._tasks:
            raise RuntimeError("start the engine first: `async with engine:` or engine.start()")
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation (Ctrl-C)
            # that arrives with the batch, and the run would train on
            async with asyncio.timeout(timeout_s):
                item = await self._batches.get()
        except TimeoutError:
            raise TimeoutError(
                f"no rollout batch within {timeout_s} s: {len(self._groups)} groups in flight, "
                f"{len(self.bucket.kept)} kept of {self.settings.prompts_batch_size_for_trainer}, "
                f"paused={self.paused}, "
                f"unreachable servers={sorted(self.pool.down)}"
            ) from None
        if isinstance(item, BaseException):
            self._batches.put_nowait(item)
            raise item
        return item

    def weights_updated(self, version: int, servers: Sequence[str] | None = None) -> None:
        """Weight version ``version`` is now live on ``servers`` (default: all; 0 = the base model).

        ``servers`` must include every server in the training pool; drained servers may be left
        out (they keep their version until they are updated and restored).
        """
        if version < self.version:
            raise ValueError(f"weight version went back from {self.version} to {version}")
        moved = self.pool.update(version, servers)
        self.version = version
        self._emit("weights_updated", version=version, servers=sorted(moved))
        limit = self.settings.max_off_policy_steps
        for group in list(self._groups.values()):
            delta = moved.get(group.server, 0)
            if delta == 0:
                continue
            for run in group.runs:
                if run.generating:
                    run.out.off_policy_steps += delta
            if limit >= 0 and any(r.out.off_policy_steps > limit for r in group.runs):
                self._cancel_group(group, "off_policy")
        self._wake.set()

    async def drain_servers(
        self, servers: Sequence[str], *, reason: str = "eval_drain", timeout_s: float = 60.0
    ) -> int:
        """Take ``servers`` out of the training pool; returns how many groups were cancelled.

        No new group goes to them; each of their groups that still needs the server (a sample not
        started or still generating) is cancelled with ``reason`` and reported in the next batch's
        ``cancelled``; groups that are only being scored finish normally. Returns once the
        cancelled requests have unwound (at most ``timeout_s``).
        """
        urls = self.pool.known(servers)
        self.pool.drained |= urls
        victims = self._needing(urls)
        self._emit("servers_drained", servers=sorted(urls), reason=reason, cancelled_groups=len(victims))
        self._cancel_all(victims, reason, requeue=False)
        await self._unwind(victims, timeout_s)
        return len(victims)

    async def server_lost(self, url: str, *, reason: str = "server_restart", timeout_s: float = 60.0) -> int:
        """A server of the pool died: nothing goes to it until :meth:`server_back`; returns how many
        groups were cancelled.

        Each of its groups that still needs it is cancelled with ``reason`` (reported in the next
        batch's ``cancelled``) and its prompt queued again, handed out before new ones; groups only
        being scored finish normally. Returns once the cancelled requests have unwound.
        """
        (key,) = self.pool.known([url])
        victims = self._take_out(key, reason)
        await self._unwind(victims, timeout_s)
        return len(victims)

    def _take_out(self, url: str, reason: str) -> list[GroupRun]:
        """:meth:`server_lost` up to the wait: returns the groups cancelled (prompts queued again)."""
        new = url not in self.pool.lost
        self.pool.lost.add(url)
        victims = self._needing({url})
        if new:
            self._emit("server_lost", servers=[url], reason=reason, cancelled_groups=len(victims))
        self._cancel_all(victims, reason, requeue=True)
        return victims

    def server_back(self, url: str, version: int) -> None:
        """A restarted server holds weight ``version`` (it must be the pool's): it serves again."""
        (key,) = self.pool.known([url])
        if version != self.version:
            raise ValueError(
                f"server {key} holds weight version {version}, the pool is at {self.version}: send it "
                "the current weights first"
            )
        self.pool.back(key, version)
        self._emit("server_back", servers=[key], version=version)
        log.info("rollout_server_back", server=key, version=version)
        self._wake.set()

    def _needing(self, urls: set[str]) -> list[GroupRun]:
        """The groups on ``urls`` that still need their server (a sample not started or generating)."""
        return [
            g
            for g in list(self._groups.values())
            if g.server in urls and any(not r.done and (not r.started or r.generating) for r in g.runs)
        ]

    def _cancel_all(self, victims: list[GroupRun], reason: str, *, requeue: bool) -> None:
        """Cancel ``victims`` with ``reason``, optionally queueing their prompts again."""
        for group in victims:
            self._cancel_group(group, reason)
        for group in reversed(victims) if requeue else ():
            self.prompts.put_back(group.prompt)  # reversed: the oldest is handed out first
        if victims:
            log.info(
                "rollout_groups_cancelled",
                servers=sorted({g.server for g in victims}),
                groups=len(victims),
                reason=reason,
                requeued=requeue,
            )
        self._wake.set()

    async def _unwind(self, victims: list[GroupRun], timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the cancelled groups' requests to unwind."""
        tasks = [t for g in victims for t in g.tasks if t is not asyncio.current_task()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                log.warning("rollout_cancel_slow", groups=len(victims), still_unwinding=len(pending))

    def restore_servers(self, servers: Sequence[str]) -> None:
        """Put drained ``servers`` back into the training pool (they must hold the pool's version)."""
        urls = self.pool.known(servers)
        behind = self.pool.behind(urls, self.version)  # a lost one comes back with server_back
        if behind:
            raise ValueError(
                f"cannot restore servers holding weight versions {behind} into a pool at version "
                f"{self.version}: send them the current weights and call weights_updated() first"
            )
        self.pool.drained -= urls
        log.info("rollout_servers_restored", servers=sorted(urls), version=self.version)
        self._emit("servers_restored", servers=sorted(urls), version=self.version)
        self._wake.set()

    def mark_server_up(self, url: str) -> None:
        """A server that failed was restarted: dispatch to it again."""
        self.pool.down.pop(url.rstrip("/"), None)
        self._wake.set()

    @property
    def async_level(self) -> int:
        return self.step - self.version

    @property
    def in_flight_groups(self) -> int:
        return len(self._groups)

    @property
    def idle(self) -> bool:
        """No group under way, and none starts before the next ``weights_updated`` (the async limit
        pauses dispatch). A server may still be finishing a request the engine just cancelled (it
        aborts it at its next engine step)."""
        return not self._groups and self._should_pause()

    def progress(self) -> BatchProgress:
        """The batch being filled as it stands (module docstring, "Progress")."""
        progress = self.bucket.progress(self.step, len(self._groups))
        return replace(progress, grading=self.grading, grading_held=self._grading_full())

    def pending_drops(self) -> tuple[list[DroppedGroup], list[DroppedGroup]]:
        """The groups discarded and cancelled for the batch being filled so far (recorded ones;
        they ride along in that batch all the same)."""
        return list(self.bucket.discarded), list(self.bucket.cancelled)

    def state_dict(self) -> dict[str, Any]:
        """Sampler position (prompts handed out) and counters, JSON-able."""
        sampler = {**self.sampler.state_dict(), "draws": self.prompts.consumed}
        return {
            "sampler": sampler,
            "step": self.step,
            "version": self.version,
            "next_group_id": self.next_group_id,
            "next_sample_id": self.next_sample_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (call before starting)."""
        if self._tasks:
            raise RuntimeError("load_state_dict must be called before the engine starts")
        self.sampler.load_state_dict(state["sampler"])
        self.prompts.reset()
        self.step = int(state["step"])
        self.version = int(state["version"])
        self.pool.reset_versions(self.version)
        self.next_group_id = int(state["next_group_id"])
        self.next_sample_id = int(state["next_sample_id"])

    # ----------------------------------------------------------------- dispatch
    def _should_pause(self) -> bool:
        return self.step - self.version > self.settings.max_async_rollout

    def _check_pause(self) -> bool:
        """True while the async limit pauses dispatch (counts pauses and paused time)."""
        if self._should_pause():
            if not self.paused:
                self.paused = True
                self._paused_since = self.clock()
                self._paused_wall = time.time()
                self.bucket.stats["pauses"] += 1
                log.debug("rollout_paused_max_async", step=self.step, version=self.version)
                self._emit(
                    "dispatch_paused", version=self.version, max_async_rollout=self.settings.max_async_rollout
                )
            return True
        if self.paused:
            self.paused = False
            if self._paused_since is not None:
                self.bucket.stats["paused_s"] += self.clock() - self._paused_since
            self._paused_since = None
            log.debug("rollout_resumed_max_async", step=self.step, version=self.version)
            paused_s = time.time() - self._paused_wall if self._paused_wall is not None else 0.0
            self._paused_wall = None
            self._emit("dispatch_resumed", version=self.version, paused_s=paused_s)
        return False

    def _grading_full(self) -> bool:
        """More samples wait for their rewards or scores than the servers have lane slots: a slow
        grader, or a teacher server being restarted, must not pile up groups without end."""
        return self.grading > len(self.pool.servers) * self.settings.lanes_per_server

    async def _dispatch_loop(self) -> None:
        try:
            dispatched, since = 0, time.perf_counter()
            while self._failed is None:
                self._wake.clear()
                if self.on_server_down is None and self.pool.all_down:
                    raise RolloutError(
                        "every inference server is unreachable: "
                        + "; ".join(f"{u}: {e}" for u, e in self.pool.down.items())
                        + ". Check the server logs in the run directory (logs/) and restart them."
                    )
                if self._check_pause() or self._grading_full():
                    await self._wake.wait()
                    continue
                prompt = self.prompts.take()
                if self._drop_if_unfit(prompt):
                    await asyncio.sleep(0)  # a stream of unfit prompts still lets the caller run
                    continue
                picked = self.pool.pick(
                    self.settings.group_size, per_sample=self.settings.enable_individual_sample_lanes
                )
                if picked is None:
                    self.prompts.put_back(prompt)
                    await self._wake.wait()
                    continue
                url, lanes = picked
                self._start_group(url, prompt, lanes)
                dispatched += 1
                # the samples started take their lanes when they run: after a round of the servers
                # (a server's free lanes are counted again), or sooner when the round is long
                if dispatched % len(self.servers) == 0 or time.perf_counter() - since > DISPATCH_SLICE_S:
                    await asyncio.sleep(0)
                    since = time.perf_counter()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            err = exc if isinstance(exc, RolloutError) else RolloutError(f"rollout dispatch failed: {exc!r}")
            if err is not exc:
                err.__cause__ = exc
            self._fail(err)

    def fail(self, err: RolloutError) -> None:
        """Stop for good from outside (a supervisor with no server left): ``next_batch()`` raises ``err``."""
        self._fail(err)

    def _fail(self, err: RolloutError) -> None:
        """Stop for good: dispatch ends, no batch is assembled, ``next_batch()`` raises ``err``."""
        if self._failed is not None:
            return
        self._failed = err
        log.error("rollout_failed", error=str(err))
        self._batches.put_nowait(err)
        self._wake.set()

    def _drop_if_unfit(self, prompt: PreparedPrompt) -> bool:
        """Drop ``prompt`` as a ``prompt_too_long`` group when it cannot fit the context; raises
        :class:`RolloutError` once its environment is hopeless (``FailureWatch.prompt_unfit``)."""
        n, s = len(prompt.ids), self.settings
        if completion_budget(s, n) > 0:
            self.watch.prompt_fits(prompt.env_name)
            return False
        group = self._new_group(prompt, "")
        for run in group.runs:
            run.done = True
            run.out.error, run.out.error_detail = "prompt_too_long", too_long(n, s)
            run.out.finished_at = run.out.dispatched_at
        self._drop(scored_group(group, self.step, self.version), "prompt_too_long")
        if prompt.env_name not in self._warned_unfit:
            self._warned_unfit.add(prompt.env_name)
            log.warning(
                "rollout_prompt_too_long",
                env=prompt.env_name,
                prompt_tokens=n,
                max_model_len=s.max_model_len,
                note="dropped at dispatch; further ones are logged at debug",
            )
        candidates = self._candidates(prompt.env_name)
        streak = self.watch.prompt_unfit(prompt.env_name, prompt.index, n, candidates)
        if streak is not None:
            limit = s.max_consecutive_unfit_prompts
            msg = unfit_message(
                prompt.env_name,
                streak,
                candidates=candidates,
                max_model_len=s.max_model_len,
                max_tokens=s.max_tokens,
                limit=limit,
            )
            raise RolloutError(msg)
        return True

    def _candidates(self, env_name: str) -> int:
        """How many prompts the sampler can draw from ``env_name``."""
        return len(self.sampler.candidates(env_name))

    def _new_group(self, prompt: PreparedPrompt, url: str, lanes: list[int] | None = None) -> GroupRun:
        """A group of ``group_size`` fresh samples with the next group and sample ids."""
        group = GroupRun(self.next_group_id, prompt, url, lanes=lanes)
        self.next_group_id += 1
        system = system_prompt_of(self.environments[prompt.env_name], prompt)
        now = time.time()
        for _ in range(self.settings.group_size):
            out = ScoredSample(
                group_id=group.group_id,
                sample_id=self.next_sample_id,
                env_name=prompt.env_name,
                prompt_ids=prompt.ids,
                prompt_text=prompt.text,
                server=url,
                system_prompt=system,
                sample_index=prompt.index,
                dispatched_at=now,
            )
            self.next_sample_id += 1
            group.runs.append(SampleRun(out))
        return group

    def _start_group(self, url: str, prompt: PreparedPrompt, lanes: list[int] | None) -> None:
        group = self._new_group(prompt, url, lanes)
        self._groups[group.group_id] = group
        for i, run in enumerate(group.runs):
            lane = lanes[i] if lanes is not None else None
            task = asyncio.create_task(self._run_sample(group, run, lane))
            group.tasks.add(task)
            task.add_done_callback(group.tasks.discard)

    async def _run_sample(self, group: GroupRun, run: SampleRun, lane: int | None) -> None:
        pool = self.pool.lanes[group.server]
        individual = self.settings.enable_individual_sample_lanes
        out = run.out
        held: int | None = None
        grading = False  # counted in self.grading
        t_queued = self.clock()
        try:
            if individual:
                held = await pool.acquire()
                out.lane = held
            else:
                out.lane = lane if lane is not None else -1
            run.started = run.generating = True
            out.version_start = self.pool.versions[group.server]
            t0 = self.clock()
            out.timings["queue_s"] = t0 - t_queued

            def on_generated() -> None:
                nonlocal held, grading
                run.generating = False
                out.version_end = self.pool.versions[group.server]
                out.timings["generation_s"] = self.clock() - t0
                if held is not None and self.settings.free_lane_after_generation:
                    pool.release(held)
                    held = None
                    grading = True
                    self.grading += 1
                    self._wake.set()

            env = self.environments[group.prompt.env_name]
            eos = self.eos_token or env.eos_token
            play = Play(
                self.client,
                self.settings,
                self.prompts,
                eos,
                on_generated,
                version=lambda: self.pool.versions[group.server],
                gateway=self.agent_gateway,
            )
            failure = await play_sample(env, group.prompt, out, play)
            if isinstance(failure, ServerUnavailableError):
                self._server_unreachable(group.server, failure)
            if run.generating:
                run.generating = False
                out.version_end = self.pool.versions[group.server]
            out.timings["reward_s"] = self.clock() - t0 - out.timings.get("generation_s", 0.0)
            if self.scorers and out.error is None:
                await self._score_tokens(out)
        finally:
            if held is not None:
                pool.release(held)
                self._wake.set()
            if grading:
                self.grading -= 1
                self._wake.set()
            run.generating = False
            run.done = True
        self._sample_done(group)

    def _server_unreachable(self, url: str, error: ServerUnavailableError) -> None:
        """Only an unreachable server leaves the pool (a timeout fails its sample alone); when
        supervised, its groups are generated again while the caller restarts it."""
        if url in self.pool.down:
            return
        log.error("inference_server_unreachable", server=url, error=str(error))
        self.pool.down[url] = str(error)
        if self.on_server_down is not None:
            self._take_out(url, "server_restart")
            self.on_server_down(url, str(error))

    async def _score_tokens(self, out: ScoredSample) -> None:
        """Every scorer's logprobs of every sequence of ``out``; a failure is the sample's error."""
        t0 = self.clock()
        sequences: list[ScoredSample | TrainingSequence] = [out, *out.extra_sequences]
        jobs = [(seq, scorer) for seq in sequences for scorer in self.scorers]
        results = await asyncio.gather(
            *(scorer.score(seq.prompt_ids, seq.completion_ids) for seq, scorer in jobs),
            return_exceptions=True,
        )
        for (seq, scorer), result in zip(jobs, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
            problem = _store_scores(seq, scorer.name, result)
            if problem is not None:  # the sample fails, its group ends
                out.error, out.error_detail = "scoring_error", problem
        out.timings["score_s"] = self.clock() - t0

    # ----------------------------------------------------------------- acceptance
    def _release_group_lanes(self, group: GroupRun) -> None:
        if group.lanes is not None:
            for lane in group.lanes:
                self.pool.lanes[group.server].release(lane)
            group.lanes = None
            self._wake.set()

    def _drop(self, sg: ScoredGroup, reason: str, cancelled: bool = False) -> None:
        self.bucket.drop(DroppedGroup(sg, reason, self.step, self.version), cancelled=cancelled)
        log.debug("rollout_dropped", group_id=sg.group_id, reason=reason, cancelled=cancelled)

    def _cancel_group(self, group: GroupRun, reason: str) -> None:
        group.cancelled = True
        self.cancelled_groups += 1
        self._groups.pop(group.group_id, None)
        for t in group.tasks:
            t.cancel()
        now = time.time()
        for r in group.runs:
            if not r.done:
                r.out.error = "cancelled"
                r.out.finished_at = now
        self._release_group_lanes(group)
        self._drop(scored_group(group, self.step, self.version), reason, cancelled=True)
        self._emit("group_cancelled", reason=reason, group_id=group.group_id, server=group.server)

    def _sample_done(self, group: GroupRun) -> None:
        if group.cancelled:
            return
        group.finished += 1
        if group.finished < len(group.runs):
            return
        self._groups.pop(group.group_id, None)
        self._release_group_lanes(group)
        sg = scored_group(group, self.step, self.version)
        errors = [s for s in sg.samples if s.error]
        if errors:
            self._drop(sg, str(errors[0].error))
            # an unreachable server is the pool's concern (every server down stops the run)
            if group.server not in self.pool.down:
                kinds = [s.error for s in sg.samples]
                run = self.watch.group_failed(kinds, sg.env_name, errors[0].error_detail)
                if run is not None:
                    self._fail(RolloutError(same_error_message(run)))
            self._wake.set()
            return
        try:
            score_advantages(sg, self.advantage_fn, self.reward_shaping)
        except Exception as exc:  # the caller's functions: a bug there cannot be retried away
            err = RolloutError(f"the engine's reward_shaping or advantage_fn raised {exc!r}")
            err.__cause__ = exc
            self._fail(err)
            return
        self.watch.group_ok()
        s = self.settings
        reward = sum(sg.rewards) / len(sg.rewards)
        self.bucket.scored(sg.env_name, reward)
        if sg.staleness > s.max_async_rollout:
            self._drop(sg, "max_async")
        elif s.discard_group_zero_advantage and is_zero_advantage([x.advantage for x in sg.samples]):
            self._drop(sg, "zero_advantage")
            self._watch_flat(sg.env_name, reward)
        else:
            self.watch.group_kept(sg.env_name)
            if self.bucket.keep(sg):
                self._assemble()
        self._wake.set()

    def _watch_flat(self, env: str, reward: float) -> None:
        """A zero-advantage group of ``env``: stop once the run is hopeless, else name ``env`` when
        it alone trains nothing (module docstring)."""
        hopeless, stalled = self.watch.group_flat(env, reward)
        if hopeless is not None:
            batches, size = (
                self.settings.max_zero_advantage_batches,
                self.settings.prompts_batch_size_for_trainer,
            )
            self._fail(RolloutError(flat_run_message(hopeless, limit_batches=batches, batch_size=size)))
        elif stalled is not None:
            message = flat_environment_message(env, stalled)
            log.warning("rollout_environment_flat", env=env, groups=stalled.count, message=message)
            self._emit("environment_flat", env=env, groups=stalled.count, message=message)

    def _assemble(self) -> None:
        if self._failed is not None:
            return
        now = self.clock()
        stats = self.bucket.stats
        if self._paused_since is not None:
            stats["paused_s"] += now - self._paused_since
            self._paused_since = now
        discarded, cancelled = self.bucket.unrecorded("discarded"), self.bucket.unrecorded("cancelled")
        counts = dict(stats)
        batch = self.bucket.take(self.step)
        batch.metrics = batch_metrics(
            batch,
            counts,
            version=self.version,
            batch_time_s=now - self._last_batch_t,
            in_flight=len(self._groups),
            lanes_busy=sum(p.busy for p in self.pool.lanes.values()),
            drained=len(self.pool.drained),
        )
        discarded += len(batch.discarded)
        self._emit(
            "batch_assembled",
            kept=len(batch.groups),
            discarded=discarded,
            cancelled=cancelled + len(batch.cancelled),
        )
        self.step += 1
        self._last_batch_t = now
        self._cancel_unkeepable()
        self._batches.put_nowait(batch)

    def _cancel_unkeepable(self) -> None:
        """Cancel the groups still generating that can no longer be kept (reason ``max_async``).

        A group lands at the earliest in the batch being filled now, so its staleness is at least
        ``step - v0`` (``v0``: the oldest version its samples started under); once that exceeds
        ``max_async_rollout`` it would only finish to be dropped. Cancelling it at once gives its
        server back to groups that can still be kept (and, on a machine shared with the trainer,
        its cores): in a synchronous run the groups begun while a batch filled are all of this kind.
        """
        limit = self.settings.max_async_rollout
        for group in list(self._groups.values()):
            started = [r.out.version_start for r in group.runs if r.started]
            if started and self.step - min(started) > limit:
                self._cancel_group(group, "max_async")
