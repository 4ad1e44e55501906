"""A group in flight and what happens to it once every sample finished: its scored form, the
caller's reward shaping and advantages, and the zero-advantage rule.

``GroupRun`` is one group of ``group_size`` samples on one server (the engine's own state);
:func:`scored_group` is what the engine hands out; :func:`score_advantages` runs the caller's
``reward_shaping`` and ``advantage_fn`` on it; :func:`is_zero_advantage` is the drop rule of
``discard_group_zero_advantage``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from telescope_rollout.engine._prompts import PreparedPrompt
from telescope_rollout.engine._results import ScoredGroup, ScoredSample

__all__ = [
    "ZERO_ADVANTAGE_TOL",
    "AdvantageFn",
    "GroupRun",
    "RewardShaping",
    "SampleRun",
    "is_zero_advantage",
    "score_advantages",
    "scored_group",
]

AdvantageFn = Callable[[list[float]], Sequence[float]]
"""The rewards of one group in, one advantage per sample out (the caller's estimator, e.g.
``telescope_algos.group_advantages`` with the run's algorithm bound)."""
RewardShaping = Callable[[ScoredSample], float]
"""A scored sample in, the reward to train on out (e.g. its reward plus an overlong penalty)."""
ZERO_ADVANTAGE_TOL = 1e-9
"""Advantages of a group that differ by no more than this carry no learning signal."""


@dataclass
class SampleRun:
    """One sample of a group in flight."""

    out: ScoredSample
    started: bool = False
    generating: bool = False
    done: bool = False


@dataclass
class GroupRun:
    """One group in flight on ``server``."""

    group_id: int
    prompt: PreparedPrompt
    server: str
    runs: list[SampleRun] = field(default_factory=list[SampleRun])
    tasks: set[asyncio.Task[None]] = field(default_factory=set[asyncio.Task[None]])
    """Its samples' tasks still running: each leaves when it ends, so that a cancelled one (whose
    error's traceback holds the frame that holds this group) is freed at once, not by a full pass
    of the garbage collector."""
    lanes: list[int] | None = None
    """Group mode: the slots held by the whole group."""
    finished: int = 0
    cancelled: bool = False


def scored_group(group: GroupRun, step: int, version: int) -> ScoredGroup:
    """``group`` as handed out while batch ``step`` fills at weight ``version``: its staleness
    counts from the oldest version its started samples began under (``version`` if none did)."""
    samples = [r.out for r in group.runs]
    started = [s.version_start for r, s in zip(group.runs, samples, strict=True) if r.started]
    v0 = min(started) if started else version
    return ScoredGroup(
        group_id=group.group_id,
        env_name=group.prompt.env_name,
        samples=samples,
        prompt_text=group.prompt.text,
        sample_index=group.prompt.index,
        server=group.server,
        version_start=v0,
        staleness=step - v0,
    )


def score_advantages(
    sg: ScoredGroup, advantage_fn: AdvantageFn, reward_shaping: RewardShaping | None = None
) -> None:
    """Shape each sample's reward (when the caller gave ``reward_shaping``), then set advantages."""
    if reward_shaping is not None:
        for sample in sg.samples:
            sample.reward = float(reward_shaping(sample))
    advantages = list(advantage_fn(sg.rewards))
    if len(advantages) != len(sg.samples):
        raise ValueError(f"advantage_fn returned {len(advantages)} advantages for {len(sg.samples)} rewards")
    for sample, a in zip(sg.samples, advantages, strict=True):
        sample.advantage = float(a)


def is_zero_advantage(advantages: Sequence[float]) -> bool:
    """The drop rule of ``discard_group_zero_advantage``: a group of more than one sample whose
    advantages are all equal (within :data:`ZERO_ADVANTAGE_TOL`)."""
    return len(advantages) > 1 and max(advantages) - min(advantages) <= ZERO_ADVANTAGE_TOL
