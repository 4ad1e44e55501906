"""Calling the run's Ray actors from the driver, so that no room above the cluster imports Ray.

``call_all`` calls one method on every actor and waits; ``start_all`` and ``wait_all`` split the
two (start the trainer ranks' set-up while the servers boot). An actor whose method raised makes
them raise ``ActorCallError`` with the actor's own exception as ``cause`` (not Ray's wrapper);
``actor_cause`` unwraps one such error anywhere. ``ping`` says whether an actor is alive, gone
or hung. (The loop awaits the handles' ``.remote()`` calls directly: they are awaitables.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog

__all__ = ["ActorCallError", "actor_cause", "call_all", "ping", "setup_infos", "start_all", "wait_all"]


class ActorCallError(RuntimeError):
    """An actor's method raised: ``cause`` is the exception it raised on the actor's side."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def actor_cause(err: BaseException) -> BaseException:
    """The exception a Ray actor call raised on the actor's side (``.cause``), else ``err`` itself."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def start_all(actors: Sequence[Any], method: str, *args: Any) -> list[Any]:
    """Call ``method(*args)`` on every actor without waiting: the pending results, for ``wait_all``."""
    return [getattr(actor, method).remote(*args) for actor in actors]


def wait_all(pending: list[Any], timeout: float | None = None) -> list[Any]:
    """The results of ``start_all``'s calls, in order (``ActorCallError`` when one raised; Ray's
    ``GetTimeoutError`` after ``timeout`` seconds)."""
    import ray
    from ray.exceptions import RayTaskError

    try:
        return list(ray.get(pending, timeout=timeout))
    except RayTaskError as err:
        raise ActorCallError(actor_cause(err)) from err


def call_all(actors: Sequence[Any], method: str, *args: Any, timeout: float | None = None) -> list[Any]:
    """``method(*args)`` on every actor, waited for: the results in the actors' order."""
    return wait_all(start_all(actors, method, *args), timeout)


def setup_infos(actors: Sequence[Any]) -> list[dict[str, Any]]:
    """Each worker's ``setup_info()`` (pid, role, node, versions, the model's facts), for the
    record; none, with a warning, when they do not answer in a minute (the run goes on)."""
    try:
        return call_all(actors, "setup_info", timeout=60)
    except Exception as exc:
        structlog.get_logger().warning("setup of the workers not recorded", error=repr(exc))
        return []


async def ping(actor: Any, timeout_s: float) -> str | None:
    """None when the actor answers ``ping`` within ``timeout_s``; else why not: ``"hung"``, or
    ``"its process is gone (...)"``."""
    from ray.exceptions import RayActorError

    try:
        async with asyncio.timeout(timeout_s):
            await actor.ping.remote()
    except RayActorError as exc:
        return f"its process is gone ({type(exc).__name__})"
    except TimeoutError:
        return "hung"
    return None
