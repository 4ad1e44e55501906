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
    SandboxRequestError,
)


class FakeSandbox(Sandbox):
    """A stateful in-memory sandbox: echoes argv, can be told to fail, records concurrency."""

    name = "fake"
    created = 0
    active = 0
    peak = 0

    def __init__(self) -> None:
        super().__init__()
        FakeSandbox.created += 1
        self.ident = FakeSandbox.created

    async def _execute(self, request: ExecRequest) -> ExecResult:
        FakeSandbox.active += 1
        FakeSandbox.peak = max(FakeSandbox.peak, FakeSandbox.active)
        try:
            await asyncio.sleep(0.01)
            if request.argv[0] == "infra-fail":
                raise SandboxInfraError("the fake machine went away")
            if request.argv[0] == "bug":
                raise RuntimeError("a bug in the caller's code")
            return ExecResult(stdout=f"{self.ident}:{' '.join(request.argv)}", stderr="", exit_code=0)
        finally:
            FakeSandbox.active -= 1


@pytest.fixture(autouse=True)
def _reset_fake():
    FakeSandbox.created = FakeSandbox.active = FakeSandbox.peak = 0


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
    async with SandboxPool(FakeSandbox, max_concurrency=1) as pool:
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
