"""The server supervisor's decisions, driven with fakes of the engine, the server actors and the
trainer ranks (the real ones: tests/test_e2e_chaos.py): the order of a restart and resync, a
failed update's probe, a blip, giving up, the watcher's triggers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import telescope_weightsync
from telescope_orchestrator.recovery import servers as _supervise
from telescope_orchestrator.recovery.servers import (
    RESTART_GROUP,
    ServersGone,
    ServerSupervisor,
    SupervisorLimits,
)

A, B = "http://a:1", "http://b:2"


class _Method:
    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        async def call() -> Any:
            self.owner.calls.append((self.owner.name, self.name, args))
            result = getattr(self.owner, f"do_{self.name}")(*args)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.ensure_future(call())


class _Actor:
    """``actor.method.remote(...)`` returns an awaitable, as a Ray actor handle does."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("do_") or method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)


class _Server(_Actor):
    def __init__(self, name: str, calls: list) -> None:
        super().__init__(name, calls)
        self.code: int | None = None
        self.restart_fails = 0
        self.actor_gone = False

    def do_exit_code(self) -> int | None:
        if self.actor_gone:
            raise RuntimeError("RayActorError: the actor died unexpectedly")
        return self.code

    def do_restart(self, timeout_s: float) -> str:
        if self.restart_fails:
            self.restart_fails -= 1
            raise RuntimeError("port in use")
        self.code = None
        return self.name

    def do_failure_report(self, what: str) -> str:
        return f"{what} (out of memory). Log: {self.name}/server.log"


class _Trainer(_Actor):
    def __init__(self, calls: list) -> None:
        super().__init__("trainer", calls)
        self.publish_errors: list[Exception] = []
        self.form_errors: list[Exception] = []
        self.on_failure = lambda: None

    def do_reconnect_weights(self, groups: dict) -> bool:
        if self.form_errors:
            self.on_failure()
            raise self.form_errors.pop(0)
        return True

    def do_publish(self, version: int, group: str) -> dict:
        if self.publish_errors:
            self.on_failure()
            raise self.publish_errors.pop(0)
        return {"bytes": 1.0}

    def do_disconnect_weights(self, group: str) -> None:
        return None


class _Engine:
    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.version = 2
        self.server_versions = {A: 2, B: 2}
        self.on_server_down = None
        self.failed: BaseException | None = None

    async def server_lost(self, url: str) -> int:
        self.calls.append(("engine", "server_lost", (url,)))
        return 1

    def server_back(self, url: str, version: int) -> None:
        self.calls.append(("engine", "server_back", (url, version)))

    def fail(self, err: BaseException) -> None:
        self.failed = err


def _supervisor(max_restarts: int = 3, servers=(A, B), health_timeout_s: float = 60.0):
    calls: list = []
    engine: Any = _Engine(calls)
    actors = {u: _Server(u, calls) for u in servers}
    trainer = _Trainer(calls)
    events: list = []
    limits = SupervisorLimits(
        max_restarts=max_restarts, health_timeout_s=health_timeout_s, start_timeout_s=60, update_timeout_s=20
    )
    sup = ServerSupervisor(
        engine=engine, servers=list(actors.items()), trainers=[trainer], groups={"full": list(servers)},
        limits=limits, event=lambda kind, **d: events.append((kind, d)), say=lambda text: None,
    )  # fmt: skip
    return sup, engine, actors, trainer, calls, events


async def _settle(sup: ServerSupervisor) -> None:
    for _ in range(100):
        await asyncio.sleep(0)
        if not [t for t in sup._tasks if t.get_name() != "server-watch"]:
            return
    async with asyncio.timeout(10):  # a regression fails here instead of hanging the test
        await asyncio.gather(*[t for t in sup._tasks if t.get_name() != "server-watch"])


@pytest.fixture
def probe(monkeypatch):
    """Which servers answer the version probe (all, unless a test says otherwise), with version 3
    (the tests' failed updates are of version 3: a server that answers applied it)."""
    dead: set[str] = set()

    async def probe_version(client, url: str, *, timeout_s: float) -> int:
        if url in dead:
            raise telescope_weightsync.ServerTimeout(url, "no answer")
        return 3

    monkeypatch.setattr(telescope_weightsync, "probe_version", probe_version)
    return dead


async def test_a_dead_server_leaves_the_pool_restarts_and_gets_the_pool_s_weights_before_it_serves(probe):
    sup, _engine, _actors, _trainer, calls, events = _supervisor()
    await sup.lose(B, "its vLLM process was killed by SIGKILL")
    await _settle(sup)
    order = [(who, what, args) for who, what, args in calls if what != "exit_code"]
    assert order == [
        ("engine", "server_lost", (B,)),
        (B, "restart", (60.0,)),
        ("trainer", "reconnect_weights", ({"full": [A, B], RESTART_GROUP: [B]},)),
        ("trainer", "publish", (2, RESTART_GROUP)),
        ("trainer", "disconnect_weights", (RESTART_GROUP,)),
        ("engine", "server_back", (B, 2)),
    ]
    assert [k for k, _ in events] == ["server_down", "server_restarting", "server_restarted"]
    assert events[-1][1]["version"] == 2
    assert sup.metrics() == {"restarts/inference": 1.0, "servers/out": 0.0}
    assert sup.connected == {"full": [A, B]}


async def test_a_lost_server_is_reported_to_the_evals_and_a_restarted_one_to_the_sampler(probe):
    sup, _engine, actors, _trainer, _calls, _events = _supervisor()
    told: list[str] = []
    restarted: list = []
    sup.on_lost, sup.on_restarted = told.append, restarted.append
    await sup.lose(B, "its vLLM process was killed by SIGKILL")
    await sup.lose(B, "reported again while out")  # once
    await _settle(sup)
    assert told == [B]
    assert restarted == [actors[B]]  # the infrastructure sampler takes its new pid


async def test_an_update_that_fails_because_a_trainer_rank_died_loses_no_server(probe):
    sup, _engine, _actors, trainer, _calls, events = _supervisor()
    trainer.publish_errors = [RuntimeError("RayActorError: the actor died unexpectedly")]
    trainer.on_failure = lambda: probe.add(B)  # b would look dead too: the rank's death comes first

    async def dead() -> dict[int, str]:
        return {0: "its process is gone (ActorDiedError)"}

    sup.trainers_dead = dead
    with pytest.raises(RuntimeError, match="RayActorError"):
        async with sup.lock:
            await sup.publish(3, "full")
    assert not [k for k, _ in events if k == "server_down"]
    assert sup.connected == {}  # the next update forms the groups again (with new ranks)
    await sup.close()


async def test_a_failed_update_probes_its_servers_loses_the_dead_one_and_sends_again(probe):
    sup, _engine, actors, trainer, calls, events = _supervisor()
    trainer.publish_errors = [RuntimeError("UpdateError: servers ['http://b:2'] did not apply version 3")]
    trainer.on_failure = lambda: probe.add(B)  # b's engine stopped answering during the update
    actors[B].restart_fails = 99  # keep it out while the update goes on
    async with sup.lock:
        metrics, reached = await sup.publish(3, "full")
    assert reached == [A]
    assert metrics == {"bytes": 1.0}
    publishes = [args for who, what, args in calls if what == "publish"]
    assert publishes[:2] == [(3, "full"), (3, "full")]
    # the second went to a group formed without b
    forms = [args[0] for who, what, args in calls if what == "reconnect_weights"]
    assert forms[0] == {"full": [A]}
    down = [d for k, d in events if k == "server_down"]
    assert down[0]["server"] == B
    assert "weight update 3 failed" in down[0]["reason"]
    await sup.close()


async def test_a_server_whose_engine_does_not_answer_is_lost_before_the_update(probe):
    sup, _engine, _actors, _trainer, calls, events = _supervisor()
    probe.add(A)
    async with sup.lock:
        _, reached = await sup.publish(3, "full")
    assert reached == [B]
    down = [d for k, d in events if k == "server_down"]
    assert [d["server"] for d in down] == [A]
    assert down[0]["reason"].startswith("before weight update 3: its engine does not answer")
    assert [args for _, what, args in calls if what == "publish"] == [(3, "full")]  # one update, without a
    await sup.close()


async def test_a_server_that_did_not_apply_a_failed_update_is_restarted(probe, monkeypatch):
    # its engine answers, but with the old version: its in-place reload broke off midway
    sup, _engine, _actors, trainer, _calls, events = _supervisor()
    trainer.publish_errors = [RuntimeError("the sender's broadcast timed out")]

    async def probe_version(client, url: str, *, timeout_s: float) -> int:
        return 2 if url == A else 3

    monkeypatch.setattr(telescope_weightsync, "probe_version", probe_version)
    async with sup.lock:
        _, reached = await sup.publish(3, "full")
    assert reached == [B]
    assert [d["server"] for k, d in events if k == "server_down"] == [A]
    await sup.close()


async def test_a_failed_update_with_every_server_answering_is_sent_again_once_then_raised(probe):
    sup, _engine, _actors, trainer, _calls, events = _supervisor()
    trainer.publish_errors = [RuntimeError("boom"), RuntimeError("boom again")]
    async with sup.lock:
        with pytest.raises(RuntimeError, match="boom again"):
            await sup.publish(3, "full")
    assert [k for k, _ in events] == []  # nobody was found dead


async def test_an_unreachable_server_that_answers_the_probe_is_kept(probe):
    sup, _engine, _actors, _trainer, calls, events = _supervisor()
    await sup._reported(B, "ConnectError")
    assert ("engine", "server_back", (B, 2)) in calls
    assert not any(what == "restart" for _, what, _ in calls)
    assert [k for k, _ in events] == ["server_blip"]


async def test_past_its_restarts_a_server_is_given_up_and_with_none_left_the_engine_fails(probe):
    sup, engine, actors, _trainer, _calls, events = _supervisor(max_restarts=1, servers=(A,))
    actors[A].restart_fails = 1
    await sup.lose(A, "its vLLM process was killed by SIGKILL")
    await _settle(sup)
    assert isinstance(engine.failed, ServersGone)
    message = str(engine.failed)
    assert message.startswith("no inference server is left: inference server http://a:1 died")
    assert "(out of memory). Log: http://a:1/server.log" in message
    assert "--resume_from_checkpoint true" in message
    assert [k for k, _ in events] == ["server_down", "server_restarting", "server_restart_failed",
                                      "server_given_up"]  # fmt: skip


async def test_with_restarts_off_a_dead_server_is_given_up_and_the_others_train_on(probe):
    sup, engine, _actors, _trainer, calls, _events = _supervisor(max_restarts=0)
    await sup.lose(B, "its vLLM process exited with code 1")
    assert engine.failed is None
    assert sup.groups_now() == {"full": [A]}
    assert not any(what == "restart" for _, what, _ in calls)


async def test_the_watcher_restarts_an_exited_server_and_one_failing_health_too_long(probe, monkeypatch):
    monkeypatch.setattr(_supervise, "POLL_S", 0.01)
    sup, _engine, actors, _trainer, _calls, events = _supervisor(health_timeout_s=0.05)
    sup.start()
    assert sup._http is not None
    await sup._http.aclose()
    sup._http = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(503 if r.url.host == "a" else 200))
    )
    actors[B].code = -9
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len([k for k, _ in events if k == "server_restarted"]) == 2:
            break
    await sup.close()
    reasons = {d["server"]: d["reason"] for k, d in events if k == "server_down"}
    assert reasons[B] == "its vLLM process was killed by SIGKILL"
    assert reasons[A].startswith("/health failed for")


async def test_the_watcher_restarts_a_server_whose_engine_is_stuck_behind_a_healthy_health(
    probe, monkeypatch
):
    monkeypatch.setattr(_supervise, "POLL_S", 0.01)
    sup, _engine, _actors, _trainer, _calls, events = _supervisor(health_timeout_s=0.05)
    sup.start()
    assert sup._http is not None
    await sup._http.aclose()
    sup._http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    probe.add(B)  # /health answers 200, the engine does not
    for _ in range(200):
        await asyncio.sleep(0.01)
        if any(k == "server_down" for k, _ in events):
            break
    await sup.close()
    down = [d for k, d in events if k == "server_down"]
    assert [d["server"] for d in down] == [B]
    assert down[0]["reason"].startswith("its engine did not answer for")


async def test_a_server_is_failing_from_the_start_of_the_first_check_that_found_it(monkeypatch):
    # each probe waits 0.2 s for an engine that never answers; the timeout is 0.3 s: the second
    # failing check ends 0.4 s after the first began, so it declares the server dead (counting from
    # the first check's end would wait for a third)
    sup, *_ = _supervisor(health_timeout_s=0.3)

    async def unresponsive(url: str, **_: Any) -> str:
        await asyncio.sleep(0.2)
        return "its engine did not answer"

    monkeypatch.setattr(sup, "_unresponsive", unresponsive)
    server = sup.servers[B]
    assert await sup._check(server) is None
    reason = await sup._check(server)
    assert reason is not None
    assert reason.startswith("its engine did not answer for"), reason
    await sup.close()


async def test_a_failed_forming_with_every_server_alive_restarts_none(monkeypatch):
    # no weights moved: the servers still serve the old version, and that is no sign of a broken reload
    async def probe_version(client, url: str, *, timeout_s: float) -> int:
        return 2

    monkeypatch.setattr(telescope_weightsync, "probe_version", probe_version)
    sup, _engine, _actors, trainer, calls, events = _supervisor()
    sup.connected = {}
    trainer.form_errors = [RuntimeError("GroupError: group 'full': http://b:2 did not join within 20s")]
    async with sup.lock:
        _, reached = await sup.publish(3, "full")
    assert reached == [A, B]
    assert [k for k, _ in events] == []
    assert [args for _, what, args in calls if what == "publish"] == [(3, "full")]
    await sup.close()


async def test_a_dead_ray_actor_is_a_dead_server_not_a_crash(probe):
    sup, _engine, actors, _trainer, _calls, events = _supervisor()
    actors[B].actor_gone = True
    actors[B].restart_fails = 99
    async with sup.lock:
        _, reached = await sup.publish(3, "full")
    assert reached == [A]
    down = [d for k, d in events if k == "server_down"]
    assert down[0]["reason"] == (
        "before weight update 3: its actor does not answer (RuntimeError: RayActorError: the actor died "
        "unexpectedly)"
    )
    await sup.close()


async def test_a_resync_broken_by_another_server_loses_that_one_and_restarts_vllm_once(probe):
    sup, _engine, actors, trainer, calls, events = _supervisor()
    trainer.form_errors = [RuntimeError("GroupError: http://a:1 failed to join")]
    trainer.on_failure = lambda: setattr(actors[A], "code", -9)  # a dies while b rejoins
    actors[A].restart_fails = 99
    await sup.lose(B, "its vLLM process was killed by SIGKILL")
    for _ in range(100):
        await asyncio.sleep(0)
        if ("engine", "server_back", (B, 2)) in calls:
            break
    assert ("engine", "server_back", (B, 2)) in calls
    assert [args for who, what, args in calls if what == "restart" and who == B] == [(60.0,)]
    down = {d["server"]: d["reason"] for k, d in events if k == "server_down"}
    assert down[A].startswith("forming the weight-sync groups before the resync of http://b:2 failed")
    await sup.close()


async def test_the_watcher_leaves_engines_alone_while_a_step_or_update_holds_the_lock(probe, monkeypatch):
    monkeypatch.setattr(_supervise, "POLL_S", 0.01)
    sup, _engine, _actors, _trainer, _calls, events = _supervisor(health_timeout_s=0.05)
    sup._http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    probe.add(B)  # its engine is busy applying an update: a probe would wait behind it
    async with sup.lock:
        sup._spawn(sup._watch(), name="server-watch")
        await asyncio.sleep(0.3)
        assert [k for k, _ in events] == []
    for _ in range(200):
        await asyncio.sleep(0.01)
        if events:
            break
    await sup.close()
    assert [d["server"] for k, d in events if k == "server_down"] == [B]


async def test_after_close_a_reported_server_starts_nothing(probe):
    sup, engine, _actors, _trainer, calls, events = _supervisor()
    await sup.close()
    engine.on_server_down(B, "ConnectError")
    await asyncio.sleep(0)
    assert sup._tasks == set()
    assert events == []
    assert calls == []


def test_the_limits_are_the_run_configs_fields():
    from telescope_config.testing import make_config

    cfg = make_config(
        inference_max_restarts=5, inference_health_timeout_seconds=7, ray_placement_timeout_s=90,
        weight_broadcast_timeout_s=11,
    )  # fmt: skip
    assert SupervisorLimits.from_config(cfg) == SupervisorLimits(5, 7.0, 90.0, 11.0)


# ------------------------------------------------------------------ the teacher's and reference model's
T1, T2 = "http://t:1", "http://t:2"


class _Scorer:
    """What the supervisor uses of a ``ServedScorer``: which servers are out, and its failure."""

    name = "teacher"

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.on_server_down: Any = None
        self.failed: Exception | None = None

    def server_lost(self, url: str) -> None:
        self.calls.append(("teacher", "server_lost", (url,)))

    def server_back(self, url: str) -> None:
        self.calls.append(("teacher", "server_back", (url,)))

    def fail(self, error: Exception) -> None:
        self.failed = error


def _with_teacher(max_restarts: int = 3):
    calls: list = []
    engine: Any = _Engine(calls)
    scorer = _Scorer(calls)
    teachers = {u: _Server(u, calls) for u in (T1, T2)}
    events: list = []
    sup = ServerSupervisor(
        engine=engine, servers=[(u, _Server(u, calls)) for u in (A, B)], trainers=[_Trainer(calls)],
        groups={"full": [A, B]},
        limits=SupervisorLimits(max_restarts=max_restarts, health_timeout_s=60, start_timeout_s=60,
                                update_timeout_s=20),
        event=lambda kind, **d: events.append((kind, d)), say=lambda text: None,
        scorer_servers=[(u, a, scorer) for u, a in teachers.items()],
    )  # fmt: skip
    return sup, engine, scorer, calls, events


async def test_a_dead_teacher_server_leaves_its_scorer_restarts_and_comes_back_without_weights(probe):
    sup, _engine, scorer, calls, events = _with_teacher()
    assert scorer.on_server_down is not None  # the scorer reports servers it finds unreachable
    await sup.lose(T2, "its vLLM process was killed by SIGKILL")
    await _settle(sup)
    order = [(who, what, args) for who, what, args in calls if what != "exit_code"]
    assert order == [
        ("teacher", "server_lost", (T2,)),
        (T2, "restart", (60.0,)),
        ("teacher", "server_back", (T2,)),
    ]  # no engine pool change, no weight-sync group, no publish: the teacher never changes
    assert [k for k, _ in events] == ["server_down", "server_restarting", "server_restarted"]
    assert events[-1][1]["version"] is None
    assert sup.groups_now() == {"full": [A, B]}
    assert sup.metrics() == {"restarts/inference": 1.0, "servers/out": 0.0}


async def test_with_every_teacher_server_given_up_the_scorer_and_the_engine_fail(probe):
    sup, engine, scorer, _calls, _events = _with_teacher(max_restarts=0)
    await sup.lose(T1, "its vLLM process exited with code 1")
    assert engine.failed is None  # the other teacher server scores on
    await sup.lose(T2, "its vLLM process exited with code 1")
    assert isinstance(engine.failed, ServersGone)
    assert scorer.failed is engine.failed
    assert str(engine.failed).startswith(
        "no teacher server is left: teacher server http://t:2 died 1 time(s)"
    )
    assert sup.groups_now() == {"full": [A, B]}  # the policy servers are untouched


async def test_an_unreachable_teacher_server_that_answers_health_is_put_back(probe):
    sup, _engine, scorer, calls, events = _with_teacher()
    sup._http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    scorer.on_server_down(T1, "connection refused")
    await _settle(sup)
    assert ("teacher", "server_back", (T1,)) in calls
    assert [k for k, _ in events] == ["server_blip"]
    await sup.close()
