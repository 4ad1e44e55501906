"""Environments that run code get a sandbox pool from their kwargs; a provider that cannot work
fails at start-up with the environment, the provider and the fix."""

from __future__ import annotations

import pytest

from telescope_config.testing import make_config
from telescope_orchestrator.run.sandboxes import (
    SandboxSetupError,
    attach_sandboxes,
    close_sandboxes,
    needs_sandbox,
    sandbox_metrics,
)
from telescope_orchestrator.run.wiring import build_training_environments
from telescope_rollout import CommandAgentEnvironment, get_environment
from telescope_rollout.envs.i3_code import I3CodeEnv
from telescope_sandbox import SandboxPool

SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


async def test_i3_code_gets_a_local_pool_and_its_rewards_run_in_bubblewrap():
    kwargs = {
        "provider": "local",
        "pool_size": 3,
        "dataset": "bundled",
        "infra_retries": 1,
        "breaker_after": 4,
    }
    cfg = make_config(environments=[{"name": "i3_code", "kwargs": kwargs}])
    built, pools = build_training_environments(cfg)
    env = built[0].env
    assert isinstance(env, I3CodeEnv)
    try:
        assert isinstance(env.sandbox, SandboxPool)
        assert pools == [env.sandbox]
        assert env.sandbox.max_concurrency == 3
        assert (env.sandbox.infra_retries, env.sandbox.breaker.threshold) == (1, 4)
        assert env.sandbox.breaker.cooldown_s == 30.0  # the pool's default
        samples = env.load_dataset()
        add = next(s for s in samples if "sum" in str(s.prompt))
        result = await env.score(SUM, add)
        assert result.total_reward == 1.0, result.info_turns
        assert env.sandbox.metrics()["runs"] >= 1
        counted = sandbox_metrics(pools)
        assert counted == {"sandbox/failures": 0.0, "sandbox/infra_retries": 0.0, "sandbox/fast_failed": 0.0,
                           "sandbox/breaker_opened": 0.0}  # fmt: skip
    finally:
        await close_sandboxes(pools)


async def test_the_default_provider_is_local():
    env = get_environment("i3_code", dataset="bundled")
    assert isinstance(env, I3CodeEnv)
    assert needs_sandbox(env)
    pools = attach_sandboxes([("i3_code", env, {})])
    try:
        assert isinstance(env.sandbox, SandboxPool)
        assert not needs_sandbox(env)
    finally:
        await close_sandboxes(pools)


def test_environments_without_needs_get_nothing():
    env = get_environment("countdown", dataset="bundled")
    assert attach_sandboxes([("countdown", env, {"provider": "daytona"})]) == []
    assert getattr(env, "sandbox", None) is None


def test_a_missing_sdk_names_environment_provider_and_fix(monkeypatch):
    monkeypatch.setenv("DAYTONA_API_KEY", "k")  # credentials present: the SDK extra is what lacks
    env = get_environment("i3_code", dataset="bundled")
    with pytest.raises(SandboxSetupError) as info:
        attach_sandboxes([("i3_code", env, {"provider": "daytona", "pool_size": 10})])
    text = str(info.value)
    assert "environment 'i3_code'" in text
    assert "provider 'daytona'" in text
    assert "pip install 'telescope-sandbox[daytona]'" in text
    assert "`provider: local`" in text


def test_missing_credentials_are_named_before_anything_starts(monkeypatch):
    for name in ("E2B_API_KEY", "DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = get_environment("i3_code", dataset="bundled")
    with pytest.raises(SandboxSetupError, match=r"none of E2B_API_KEY is set.*Fix: pip install"):
        attach_sandboxes([("code", env, {"provider": "e2b"})])


def test_an_unknown_provider_lists_the_installed_ones():
    env = get_environment("i3_code", dataset="bundled")
    known = r"no such provider \(installed: daytona, e2b, local, modal\)"
    with pytest.raises(SandboxSetupError, match=known):
        attach_sandboxes([("code", env, {"provider": "nope"})])


def test_every_problem_is_reported_at_once(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    a, b = get_environment("i3_code", dataset="bundled"), get_environment("i3_code", dataset="bundled")
    with pytest.raises(SandboxSetupError) as info:
        attach_sandboxes([("first", a, {"provider": "nope"}), ("second", b, {"provider": "e2b"})])
    assert "'first'" in str(info.value)
    assert "'second'" in str(info.value)


async def test_a_command_agent_gets_a_local_pool_that_does_not_replay_its_runs():
    env = get_environment("quickstart_agent_command")
    assert isinstance(env, CommandAgentEnvironment)
    assert needs_sandbox(env)
    pools = attach_sandboxes([("agent", env, {"pool_size": 2})])
    try:
        assert isinstance(env.sandbox, SandboxPool)
        assert env.sandbox.infra_retries == 0  # a retry would replay the agent into its episode
    finally:
        await close_sandboxes(pools)
    again = get_environment("quickstart_agent_command")
    assert isinstance(again, CommandAgentEnvironment)
    pools = attach_sandboxes([("agent", again, {"infra_retries": 2})])
    try:
        assert isinstance(again.sandbox, SandboxPool)
        assert again.sandbox.infra_retries == 2  # unless the kwargs say so
    finally:
        await close_sandboxes(pools)


def test_a_command_agent_on_a_provider_that_cannot_reach_the_run_says_so(monkeypatch):
    import telescope_sandbox
    from telescope_sandbox import ExecRequest, ExecResult, Sandbox

    class Remote(Sandbox):
        name = "remote"

        async def _execute(self, request: ExecRequest) -> ExecResult:  # pragma: no cover
            raise AssertionError("never run")

    monkeypatch.setattr(telescope_sandbox, "available_sandboxes", lambda: ["local", "remote"])
    monkeypatch.setattr(telescope_sandbox, "get_sandbox", lambda name, **kw: Remote())
    env = get_environment("quickstart_agent_command")
    with pytest.raises(SandboxSetupError) as info:
        attach_sandboxes([("agent", env, {"provider": "remote"})])
    text = str(info.value)
    assert "environment 'agent' runs its agent in a sandbox that must reach the run's endpoint" in text
    assert "Fix: `provider: local`" in text
