"""Sandboxes for the environments that run code: one pool per environment, built from its kwargs.

An environment that lists ``"sandbox"`` in its ``needs`` (i3_code does) and has none yet gets a
``telescope_sandbox.SandboxPool`` as ``env.sandbox``; environments see it only through the
``telescope_rollout.SandboxLike`` protocol. The pool comes from the environment's kwargs:

- ``provider``: a ``telescope.sandboxes`` entry point (``local`` = bubblewrap on this machine,
  ``e2b``, ``modal``, ``daytona``); default ``local``;
- ``provider_kwargs``: passed to the provider's constructor (``api_key``, ``template``, ...);
- ``pool_size`` (default 10): programs run at once;
- ``infra_retries`` (2), ``breaker_after`` (10), ``breaker_cooldown_s`` (30): a run that fails on
  the provider's side is retried on a new sandbox after a backoff, and a provider that fails that
  many runs in a row fails runs at once for the cooldown (``telescope_sandbox.SandboxPool``);
  counted in the step metrics by :func:`sandbox_metrics`.

An environment whose programs must reach the run (``forwards_ports``: a command agent, which
talks to its episode's endpoint) needs a provider that can (``local``), and its runs are not
retried unless ``infra_retries`` says so (a retry would replay the agent into an episode begun).

Everything a provider needs is checked here, at start-up: a missing SDK extra, missing
credentials or a missing bubblewrap is one :class:`SandboxSetupError` naming the environment, the
provider and the fix, never a failure per sample after the batch timeout. No remote machine is
started here (they start on their first run).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from telescope_sandbox import SandboxPool

__all__ = ["SandboxSetupError", "attach_sandboxes", "close_sandboxes", "needs_sandbox", "sandbox_metrics"]

RESILIENCE = ("infra_retries", "breaker_after", "breaker_cooldown_s")
"""The pool's retry and circuit-breaker kwargs an environment may set."""
COUNTED = ("failures", "infra_retries", "fast_failed", "breaker_opened")
"""The pools' counters in the step metrics (``sandbox/<name>``, summed over the pools)."""

log = structlog.get_logger()

DEFAULT_PROVIDER = "local"
DEFAULT_POOL_SIZE = 10
CREDENTIALS: Mapping[str, tuple[str, ...]] = {
    "e2b": ("E2B_API_KEY",),
    "daytona": ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN"),
}
"""Environment variables of which one must be set (or ``provider_kwargs.api_key`` given)."""


class SandboxSetupError(RuntimeError):
    """An environment's sandbox cannot be built; the message names the environment and the fix."""


def needs_sandbox(env: object) -> bool:
    """True when ``env`` declares it needs a sandbox and has none yet."""
    return "sandbox" in getattr(type(env), "needs", ()) and getattr(env, "sandbox", None) is None


def _fail(env_name: str, provider: str, problem: str) -> SandboxSetupError:
    alternative = (
        ""
        if provider == DEFAULT_PROVIDER
        else (
            f", or run the code on this machine with `provider: local` in the kwargs of {env_name!r} "
            "(needs bubblewrap: apt-get install bubblewrap)"
        )
    )
    return SandboxSetupError(
        f"environment {env_name!r} needs a sandbox, but provider {provider!r} cannot be used: {problem}. "
        f"Fix: {_fix(provider)}{alternative}."
    )


def _fix(provider: str) -> str:
    if provider == "local":
        return "install bubblewrap (apt-get install bubblewrap)"
    if provider in CREDENTIALS or provider == "modal":
        keys = " or ".join(CREDENTIALS.get(provider, ())) or "Modal's token (`modal token new`)"
        return f"pip install 'telescope-sandbox[{provider}]' and set {keys}"
    return f"install the package that registers {provider!r} under the telescope.sandboxes entry points"


def _check_credentials(env_name: str, provider: str, provider_kwargs: Mapping[str, Any]) -> None:
    if provider == "modal":
        has_token = os.environ.get("MODAL_TOKEN_ID") or (Path.home() / ".modal.toml").is_file()
        if not has_token:
            raise _fail(env_name, provider, "no Modal token (MODAL_TOKEN_ID or ~/.modal.toml)")
        return
    names = CREDENTIALS.get(provider)
    if names and not provider_kwargs.get("api_key") and not any(os.environ.get(n) for n in names):
        raise _fail(env_name, provider, f"none of {', '.join(names)} is set")


def build_pool(env_name: str, kwargs: Mapping[str, Any], *, forwards_ports: bool = False) -> SandboxPool:
    """A ``SandboxPool`` for one environment from its kwargs (see the module docstring).
    ``forwards_ports``: the environment's programs must reach a host socket (a command agent)."""
    from telescope_sandbox import SandboxError, SandboxPool, available_sandboxes, get_sandbox

    provider = str(kwargs.get("provider") or DEFAULT_PROVIDER)
    provider_kwargs = dict(kwargs.get("provider_kwargs") or {})
    pool_size = int(kwargs.get("pool_size") or DEFAULT_POOL_SIZE)
    known = available_sandboxes()
    if provider not in known:
        raise _fail(env_name, provider, f"no such provider (installed: {', '.join(known) or 'none'})")
    _check_credentials(env_name, provider, provider_kwargs)
    try:
        probe = get_sandbox(provider, **provider_kwargs)  # checks the SDK extra / bubblewrap now
    except (ImportError, SandboxError, TypeError) as exc:
        raise _fail(env_name, provider, str(exc)) from exc
    if forwards_ports and not probe.forwards_ports:
        raise SandboxSetupError(
            f"environment {env_name!r} runs its agent in a sandbox that must reach the run's endpoint, "
            f"which provider {provider!r} cannot (only a sandbox on this machine can). "
            "Fix: `provider: local` in its kwargs (needs bubblewrap: apt-get install bubblewrap)."
        )
    settings = {k: kwargs[k] for k in RESILIENCE if kwargs.get(k) is not None}
    if forwards_ports:  # a retried run would replay its agent against an episode already begun
        settings.setdefault("infra_retries", 0)
    # one remote machine per slot, created on first use (the probe never started one)
    factory = probe if probe.stateless else (lambda: get_sandbox(provider, **provider_kwargs))
    try:
        pool = SandboxPool(factory, max_concurrency=pool_size, **settings)
    except SandboxError as exc:
        raise _fail(env_name, provider, str(exc)) from exc
    log.info("sandbox pool ready", environment=env_name, provider=provider, pool_size=pool_size)
    return pool


def attach_sandboxes(envs: Iterable[tuple[str, Any, Mapping[str, Any]]]) -> list[SandboxPool]:
    """Give each ``(name, env, kwargs)`` that needs a sandbox its pool; returns the pools built.

    All environments are checked before any error is raised, so one message lists every problem.
    """
    pools: list[SandboxPool] = []
    problems: list[str] = []
    for name, env, kwargs in envs:
        if not needs_sandbox(env):
            continue
        try:
            env.sandbox = build_pool(name, kwargs, forwards_ports=bool(getattr(env, "forwards_ports", False)))
        except SandboxSetupError as exc:
            problems.append(str(exc))
            continue
        pools.append(env.sandbox)
    if problems:
        raise SandboxSetupError("\n".join(problems))
    return pools


def sandbox_metrics(pools: Iterable[SandboxPool]) -> dict[str, float]:
    """``sandbox/<counter>`` summed over the pools since the run started ({} without pools)."""
    out: dict[str, float] = {}
    for pool in pools:
        m = pool.metrics()
        for key in COUNTED:
            out[f"sandbox/{key}"] = out.get(f"sandbox/{key}", 0.0) + float(m.get(key, 0.0))
    return out


async def close_sandboxes(pools: Iterable[SandboxPool]) -> None:
    """Close every pool (remote machines are stopped); never raises."""
    for pool in pools:
        try:
            await pool.aclose()
        except Exception as exc:
            log.warning("sandbox pool close failed", error=f"{type(exc).__name__}: {exc}")
