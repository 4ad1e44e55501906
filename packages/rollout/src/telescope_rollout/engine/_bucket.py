"""The batch being filled: the kept groups, the dropped and cancelled ones that ride along with
it, counts by reason, the rewards of finished groups per environment, and its metrics.

Dropped and cancelled groups are kept whole for the record up to ``max_recorded`` of each per
batch (the first ones); later ones are only counted (``discarded_unrecorded`` /
``cancelled_unrecorded``). Pure bookkeeping: the engine decides what is kept, dropped or
cancelled, and when a batch is taken.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from telescope_rollout.engine._progress import BatchProgress, RewardTally
from telescope_rollout.engine._results import DroppedGroup, RolloutBatch, ScoredGroup

__all__ = ["Bucket", "batch_metrics"]


class Bucket:
    """The batch being filled (module docstring)."""

    def __init__(self, size: int, max_recorded: int) -> None:
        self.size, self.max_recorded = size, max_recorded
        self.kept: list[ScoredGroup] = []
        self.discarded: list[DroppedGroup] = []
        self.cancelled: list[DroppedGroup] = []
        self.stats: defaultdict[str, float] = defaultdict(float)
        """``discarded_<reason>``, ``cancelled_<reason>``, ``*_unrecorded``, ``pauses``, ``paused_s``."""
        self.rewards: dict[str, RewardTally] = {}
        """Per environment, the mean rewards of the groups scored since the last batch."""

    def drop(self, dropped: DroppedGroup, *, cancelled: bool) -> None:
        """A group left out of training, for the record (or only counted, past ``max_recorded``)."""
        what = "cancelled" if cancelled else "discarded"
        into = self.cancelled if cancelled else self.discarded
        if len(into) < self.max_recorded:
            into.append(dropped)
        else:
            self.stats[f"{what}_unrecorded"] += 1
        self.stats[f"{what}_{dropped.reason}"] += 1

    def scored(self, env: str, reward: float) -> None:
        """A group of ``env`` finished with mean reward ``reward`` (kept or not)."""
        self.rewards.setdefault(env, RewardTally()).add(reward)

    def keep(self, group: ScoredGroup) -> bool:
        """Add a kept group; True once the batch is full."""
        self.kept.append(group)
        return len(self.kept) >= self.size

    def unrecorded(self, what: str) -> int:
        """``discarded`` or ``cancelled`` groups only counted for this batch."""
        return int(self.stats.get(f"{what}_unrecorded", 0))

    def take(self, step: int) -> RolloutBatch:
        """The batch of ``step`` (its first ``size`` kept groups and every drop); the bucket starts
        over (kept groups past ``size`` stay for the next). Call :func:`batch_metrics` before."""
        groups, self.kept = self.kept[: self.size], self.kept[self.size :]
        batch = RolloutBatch(step, groups, self.discarded, self.cancelled)
        self.discarded, self.cancelled = [], []
        self.stats.clear()
        self.rewards = {}
        return batch

    def progress(self, step: int, in_flight: int) -> BatchProgress:
        """The batch being filled as it stands (``RolloutEngine.progress``)."""
        counts: dict[str, dict[str, int]] = {"discarded": {}, "cancelled": {}}
        for key, n in self.stats.items():
            what, _, reason = key.partition("_")
            if what in counts and reason != "unrecorded":
                counts[what][reason] = int(n)
        return BatchProgress(
            step=step,
            kept=len(self.kept),
            needed=self.size,
            dropped=counts["discarded"],
            cancelled=counts["cancelled"],
            in_flight=in_flight,
            rewards={env: replace(t, values=dict(t.values)) for env, t in self.rewards.items()},
        )


def batch_metrics(
    batch: RolloutBatch,
    stats: dict[str, float],
    *,
    version: int,
    batch_time_s: float,
    in_flight: int,
    lanes_busy: int,
    drained: int,
) -> dict[str, float]:
    """The ``rollout/...`` metrics of one batch; ``stats``: the bucket's counts for it."""
    samples = batch.samples
    n = max(len(samples), 1)
    m: dict[str, float] = {
        "rollout/async_level": float(batch.step - version),
        "rollout/weight_version": float(version),
        "rollout/groups_kept": float(len(batch.groups)),
        "rollout/groups_discarded": float(len(batch.discarded)),
        "rollout/groups_cancelled": float(len(batch.cancelled)),
        "rollout/discarded_unrecorded": float(stats.get("discarded_unrecorded", 0)),
        "rollout/samples": float(len(samples)),
        "rollout/prompt_tokens": float(sum(len(s.prompt_ids) for s in samples)),
        "rollout/completion_tokens": float(sum(s.num_model_tokens for s in samples)),
        "rollout/reward_mean": sum(s.reward for s in samples) / n,
        "rollout/off_policy_steps_mean": sum(s.off_policy_steps for s in samples) / n,
        "rollout/staleness_mean": sum(g.staleness for g in batch.groups) / max(len(batch.groups), 1),
        "rollout/staleness_max": float(max((g.staleness for g in batch.groups), default=0)),
        "rollout/truncated_frac": sum(s.is_truncated for s in samples) / n,
        "rollout/batch_time_s": batch_time_s,
        "rollout/paused_s": float(stats.get("paused_s", 0.0)),
        "rollout/pauses": float(stats.get("pauses", 0)),
        "rollout/groups_in_flight": float(in_flight),
        "rollout/lanes_busy": float(lanes_busy),
        "rollout/servers_drained": float(drained),
    }
    for key, value in stats.items():
        if key.startswith(("discarded_", "cancelled_")):
            m[f"rollout/{key}"] = float(value)
    return m
