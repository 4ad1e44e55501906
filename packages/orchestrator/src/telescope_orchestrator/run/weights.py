"""Publishing a trained step's weights: the one owner of the weight-sync groups and the publish path.

The groups are computed once, at start-up (:func:`weight_groups`): ``full`` (every server) and,
when periodic evals can run beside training, ``training_only`` (every server but the eval
servers). A publish sends step s's weights to one group through ``send`` (the server supervisor's
``publish``, which leaves dead servers out and restarts them), then tells the rollout engine which
servers hold version s (``weights_updated``: it resumes paused dispatch and counts off-policy
steps). Nothing else tells the engine of a new version; a restarted server that got the current
weights again is the supervisor's own report (``server_back``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from telescope_rollout import RolloutEngine

__all__ = ["Group", "Send", "WeightUpdates", "weight_groups"]

Group = Literal["full", "training_only"]
Send = Callable[[int, str], Awaitable[tuple[dict[str, float], list[str]]]]
"""``send(step, group)``: the sender's metrics and the servers that got step ``step``'s weights."""


def weight_groups(urls: Sequence[str], *, has_evals: bool, eval_num_servers: int) -> dict[str, list[str]]:
    """The weight-sync groups of a run: ``full`` (every server), plus ``training_only`` (every
    server but the last ``eval_num_servers``) when periodic evals can run beside training."""
    urls = list(urls)
    groups = {"full": urls}
    if has_evals and 0 < eval_num_servers < len(urls):
        groups["training_only"] = urls[:-eval_num_servers]
    return groups


class WeightUpdates:
    """The run's weight updates: its groups, one publish path, the engine told of each version."""

    def __init__(self, groups: dict[str, list[str]], engine: RolloutEngine, send: Send) -> None:
        if "full" not in groups:
            raise ValueError(f"the weight-sync groups have no 'full' group: {sorted(groups)}")
        self.groups = {name: list(members) for name, members in groups.items()}
        self.engine, self.send = engine, send

    @property
    def servers(self) -> list[str]:
        """Every server of the run, in order."""
        return list(self.groups["full"])

    async def publish(self, step: int, group: Group) -> dict[str, float]:
        """Send step ``step``'s weights to ``group``; returns the sender's metrics."""
        if group not in self.groups:
            raise ValueError(f"no weight-sync group {group!r}: the run has {sorted(self.groups)}")
        metrics, reached = await self.send(step, group)
        self.engine.weights_updated(step, servers=reached)
        return metrics

    def resumed(self, step: int) -> None:
        """A resumed run: every server already holds step ``step``'s weights (the start-up sent them)."""
        self.engine.weights_updated(step)
