"""SandboxPool: bounded concurrency, reuse, retirement, metrics, and 200 concurrent runs with none lost."""

from __future__ import annotations

import asyncio

import pytest

from telescope_sandbox import (
    ExecRequest,
    ExecResult,
    LocalSandbox,
    Sandbox,
    SandboxInfraError,
    SandboxPool,
    SandboxProviderDownError,
    SandboxRequestError,
)
from telescope_sandbox._breaker import Breaker, backoff_s


class FakeSandbox(Sandbox):
    """A stateful in-memory sandbox: echoes argv, can be told to fail, records concurrency."""

    name = "fake"
    created = 0
    active = 0
    peak = 0
    flaky = 0
    """Runs of ``flaky`` that fail with an infrastructure error before it works."""

    def __init__(self) -> None:
        super().__init__()
        FakeSandbox.created += 1
        self.ident = FakeSandbox.created

    async def _execute(self, request: ExecRequest) -> ExecResult:
        FakeSandbox.active += 1
        FakeSandbox.peak = max(FakeSandbox.peak, FakeSandbox.active)
        try:
            await asyncio.sleep(0.01)
            if request.argv[0] == "flaky" and FakeSandbox.flaky > 0:
                FakeSandbox.flaky -= 1
                raise SandboxInfraError("the fake provider had a bad minute")
            if request.argv[0] == "infra-fail":
                raise SandboxInfraError("the fake machine went away")
            if request.argv[0] == "bug":
                raise RuntimeError("a bug in the caller's code")
            return ExecResult(stdout=f"{self.ident}:{' '.join(request.argv)}", stderr="", exit_code=0)
        finally:
            FakeSandbox.active -= 1


@pytest.fixture(autouse=True)
def _reset_fake():
    FakeSandbox.created = FakeSandbox.active = FakeSandbox.peak = FakeSandbox.flaky = 0


async def test_concurrency_is_bounded_and_sandboxes_reused():
    async with SandboxPool(FakeSandbox, max_concurrency=3) as pool:
        results = await asyncio.gather(*(pool.run_command(["echo", str(i)]) for i in range(30)))
        assert [r.stdout.split(":")[1] for r in results] == [f"echo {i}" for i in range(30)]
        assert FakeSandbox.peak == 3
        assert FakeSandbox.created == 3  # warm sandboxes were reused
        m = pool.metrics()
        assert m["runs"] == 30
        assert m["created"] == 3
        assert m["failures"] == 0
        assert m["max_in_flight"] == 3
        assert m["queue_wait_s_p99"] > 0
        assert m["run_time_s_p50"] > 0
        assert m["queue_wait_s_sum"] >= m["queue_wait_s_max"] >= m["queue_wait_s_p99"]
    assert pool.metrics()["retired"] == 3  # closing the pool closed them


async def test_max_uses_retires_sandboxes():
    async with SandboxPool(FakeSandbox, max_concurrency=1, max_uses_per_sandbox=2) as pool:
        idents = [(await pool.run_command(["x"])).stdout.split(":")[0] for _ in range(5)]
    assert idents == ["1", "1", "2", "2", "3"]


async def test_max_lifetime_retires_sandboxes():
    async with SandboxPool(FakeSandbox, max_concurrency=1, max_lifetime_s=0.05) as pool:
        first = await pool.run_command(["x"])
        await asyncio.sleep(0.06)
        second = await pool.run_command(["x"])
    assert first.stdout.startswith("1:")
    assert second.stdout.startswith("2:")


async def test_infra_errors_retire_the_sandbox_and_count_as_failures():
    async with SandboxPool(FakeSandbox, max_concurrency=1, infra_retries=0) as pool:
        with pytest.raises(SandboxInfraError):
            await pool.run_command(["infra-fail"])
        with pytest.raises(RuntimeError):
            await pool.run_command(["bug"])  # not the sandbox's fault: it is kept
        with pytest.raises(SandboxRequestError):
            await pool.run("x", language="cobol")
        ok = await pool.run_command(["x"])
        m = pool.metrics()
    assert ok.stdout.startswith("2:")  # sandbox 1 was retired after the infra error
    assert m["failures"] == 2
    assert m["bad_requests"] == 1
    assert m["runs"] == 1


async def test_lease_keeps_one_sandbox_for_several_runs():
    async with SandboxPool(FakeSandbox, max_concurrency=2) as pool, pool.sandbox() as sandbox:
        a = await sandbox.run_command(["a"])
        b = await sandbox.run_command(["b"])
    assert a.stdout.split(":")[0] == b.stdout.split(":")[0]


async def test_closed_pool_and_bad_arguments():
    pool = SandboxPool(FakeSandbox)
    await pool.aclose()
    with pytest.raises(SandboxRequestError, match="closed"):
        await pool.run_command(["x"])
    with pytest.raises(SandboxRequestError, match="max_concurrency"):
        SandboxPool(FakeSandbox, max_concurrency=0)
    with pytest.raises(SandboxRequestError, match="factory"):
        SandboxPool(FakeSandbox())


async def test_async_factory():
    async def make() -> Sandbox:
        return FakeSandbox()

    async with SandboxPool(make, max_concurrency=2) as pool:
        assert (await pool.run_command(["x"])).ok


@pytest.mark.slow
async def test_200_concurrent_local_runs_none_lost(sandbox: LocalSandbox):
    async with SandboxPool(sandbox, max_concurrency=16) as pool:
        results = await asyncio.gather(
            *(pool.run('echo "run $1"; echo "err $1" >&2', language="sh", args=[str(i)]) for i in range(200))
        )
        metrics = pool.metrics()
    assert len(results) == 200
    for i, r in enumerate(results):
        assert r.ok, (i, r)
        assert r.stdout == f"run {i}\n"
        assert r.stderr == f"err {i}\n"
    assert metrics["runs"] == 200
    assert metrics["failures"] == 0
    assert metrics["max_in_flight"] == 16


async def test_default_pool_uses_local_sandboxes(sandbox: LocalSandbox):
    async with SandboxPool(max_concurrency=2, max_uses_per_sandbox=2) as pool:
        results = await asyncio.gather(*(pool.run(f"print({i} * 2)") for i in range(5)))
        metrics = pool.metrics()
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(5)]
    assert metrics["created"] >= 3


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_s(a, 0.5) for a in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff_s(3, 0.0) == 0.0


async def test_infra_errors_are_retried_on_new_sandboxes_after_a_backoff():
    FakeSandbox.flaky = 2
    async with SandboxPool(FakeSandbox, max_concurrency=1, retry_backoff_s=0.05) as pool:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ok = await pool.run_command(["flaky"])
        waited = loop.time() - t0
        m = pool.metrics()
    assert ok.stdout == "3:flaky"  # the third sandbox: each failed one was retired
    assert waited >= 0.05 + 0.1  # 0.05 s, then 0.1 s
    assert (m["infra_retries"], m["failures"], m["runs"], m["breaker_opened"]) == (2, 2, 1, 0)
    FakeSandbox.flaky = 5
    async with SandboxPool(FakeSandbox, max_concurrency=1, infra_retries=2, retry_backoff_s=0) as pool:
        with pytest.raises(SandboxInfraError, match="bad minute"):
            await pool.run_command(["flaky"])  # three attempts, then the error
        assert FakeSandbox.flaky == 2


async def test_a_provider_that_stays_down_fails_runs_at_once_until_a_probe_works():
    async with SandboxPool(
        FakeSandbox, max_concurrency=4, infra_retries=0, breaker_after=3, breaker_cooldown_s=0.2
    ) as pool:
        for _ in range(3):
            with pytest.raises(SandboxInfraError, match="went away"):
                await pool.run_command(["infra-fail"])
        created = FakeSandbox.created
        with pytest.raises(SandboxProviderDownError) as err:
            await pool.run_command(["x"])  # a good run fails at once: no sandbox is made for it
        assert "3 runs in a row failed" in str(err.value)
        assert "went away" in str(err.value)
        assert FakeSandbox.created == created
        await asyncio.sleep(0.25)
        ok = await pool.run_command(["x"])  # the probe after the cooldown: closed again
        assert ok.exit_code == 0
        again = await pool.run_command(["x"])
        m = pool.metrics()
    assert again.exit_code == 0
    assert (m["breaker_opened"], m["fast_failed"], m["runs"]) == (1, 1, 2)


def test_a_failed_probe_opens_the_breaker_again():
    now = [0.0]
    b = Breaker(threshold=2, cooldown_s=10.0, clock=lambda: now[0])
    b.failed("e1")
    assert b.check() is None
    b.failed("e2")
    assert b.check() == 10.0
    assert b.opened == 1
    now[0] = 10.0
    assert b.check() is None  # the probe goes
    assert b.check() == 0.0  # the others wait for it
    b.failed("e3")
    assert b.check() == 10.0
    assert b.opened == 2
    now[0] = 21.0
    assert b.check() is None
    b.succeeded()
    assert b.check() is None
    assert b.failures == 0
