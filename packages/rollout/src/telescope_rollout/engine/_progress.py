"""How the batch being filled is going: groups kept of those needed, drops by reason, the rewards
of the groups that finished, per environment; and the one line a waiting caller prints.

Pure counting, no clock of its own: :class:`RewardTally` summarises the mean rewards of groups
(bounded memory: the lowest, highest and mean, and the count of each distinct value up to
:data:`DISTINCT`), :class:`BatchProgress` is the engine's snapshot
(``RolloutEngine.progress()``), :func:`rewards_summary` and :func:`progress_line` say it in words::

    kept 0/2 groups, dropped 14 (zero_advantage 14), 4 in flight; every finished group scored 0.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DISTINCT", "BatchProgress", "RewardTally", "progress_line", "rewards_summary"]

DISTINCT = 8
"""Distinct reward values counted one by one; past them only the range and mean are kept."""


@dataclass
class RewardTally:
    """The rewards of finished groups (one value per group: its mean reward)."""

    groups: int = 0
    low: float = math.inf
    high: float = -math.inf
    total: float = 0.0
    values: dict[float, int] = field(default_factory=dict[float, int])
    """Groups per distinct reward (rounded to 4 places), while at most :data:`DISTINCT` are seen."""
    overflow: bool = False
    """More than :data:`DISTINCT` distinct values were seen: ``values`` is incomplete."""

    def add(self, reward: float) -> None:
        self.groups += 1
        self.low, self.high = min(self.low, reward), max(self.high, reward)
        self.total += reward
        key = round(reward, 4)
        if key in self.values or len(self.values) < DISTINCT:
            self.values[key] = self.values.get(key, 0) + 1
        else:
            self.overflow = True

    @property
    def mean(self) -> float:
        return self.total / self.groups if self.groups else math.nan

    def describe(self, noun: str = "group") -> str:
        """``every group scored 0.0`` / ``38 groups scored 0.0, 2 scored 1.0`` / ``groups scored
        0.000 to 0.750 (mean 0.312)``; ``noun`` names what was counted."""
        if not self.groups:
            return f"no {noun} finished yet"
        if self.low == self.high:
            which = "every" if self.groups > 1 else "the"
            return f"{which} {noun} scored {_num(self.low)}"
        if not self.overflow and len(self.values) <= 3:
            parts = sorted(self.values.items(), key=lambda kv: (-kv[1], kv[0]))
            first = f"{parts[0][1]} {noun}{'s' if parts[0][1] > 1 else ''} scored {_num(parts[0][0])}"
            return ", ".join([first, *(f"{n} scored {_num(v)}" for v, n in parts[1:])])
        return f"{noun}s scored {self.low:.3f} to {self.high:.3f} (mean {self.mean:.3f})"


def _num(value: float) -> str:
    if not math.isfinite(value) or value != int(value):
        return f"{value:.4g}"
    return f"{value:.1f}"


@dataclass(frozen=True)
class BatchProgress:
    """The batch being filled, as the engine sees it now (``RolloutEngine.progress()``)."""

    step: int
    """The batch being filled (the engine counts from 0)."""
    kept: int
    """Groups kept for it so far."""
    needed: int
    """Groups it takes (``prompts_batch_size_for_trainer``)."""
    dropped: dict[str, int]
    """Groups discarded since the last batch, by reason (zero_advantage, max_async, error kinds)."""
    cancelled: dict[str, int]
    """Groups cancelled since the last batch, by reason (max_async, off_policy, ...)."""
    in_flight: int
    """Groups generating or being scored."""
    rewards: dict[str, RewardTally]
    """Per environment, the rewards of the groups scored since the last batch (kept or dropped)."""
    grading: int = 0
    """Samples past generation whose reward, or a teacher's or reference model's scores, are pending."""
    grading_held: bool = False
    """No group is dispatched while more samples wait for rewards or scores than the servers have lane
    slots (docs/rollout.md, "Lanes")."""


def rewards_summary(rewards: Mapping[str, RewardTally]) -> str:
    """The rewards of the finished groups in a few words; per environment when there are several."""
    if not rewards:
        return "no group finished yet"
    if len(rewards) == 1:
        ((_, tally),) = rewards.items()
        return tally.describe("finished group")
    return "; ".join(f"{env}: {tally.describe()}" for env, tally in sorted(rewards.items()))


def _by_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def progress_line(p: BatchProgress) -> str:
    """``kept 0/2 groups, dropped 14 (zero_advantage 14), cancelled 2 (max_async 2), 4 in flight;
    every finished group scored 0.0``."""
    parts = [f"kept {p.kept}/{p.needed} groups"]
    for word, counts in (("dropped", p.dropped), ("cancelled", p.cancelled)):
        if counts:
            parts.append(f"{word} {sum(counts.values())} ({_by_reason(counts)})")
    parts.append(f"{p.in_flight} in flight")
    if p.grading_held:
        parts.append(f"new groups held back: {p.grading} samples wait for their rewards or scores")
    return f"{', '.join(parts)}; {rewards_summary(p.rewards)}"
