"""Derived step metrics: statistics of a step's rollout batch, all under ``derived/``.

:func:`derived_metrics` takes a batch shaped like :class:`telescope_rollout.engine.RolloutBatch`
(``groups`` of samples, ``discarded`` and ``cancelled`` dropped groups; any objects with those
attributes do) and the step's timings. Definitions (``stats`` of a list of numbers gives
``_mean``, ``_std`` (population standard deviation), ``_min`` and ``_max``; an empty list gives no
key at all, never NaN; NaN values are left out; ``_pct`` values are percentages, 0..100):

Kept samples (every sample of ``batch.groups``):

- ``derived/reward_*``, ``derived/advantage_*``: stats of ``reward``, ``advantage``;
- ``derived/length_completion_*``: stats of the model tokens of a sample, ``sum(completion_mask)``
  (``len(completion_ids)`` when the mask is empty); ``derived/length_prompt_*``: of
  ``len(prompt_ids)``; ``derived/length_sum_*``: of ``len(prompt_ids) + len(completion_ids)``
  (the context the sample used, environment tokens included);
- ``derived/stop_reason_length_pct``: 100 * samples with ``is_truncated`` / samples;
- ``derived/off_policy_steps_mean`` / ``_std``;
- ``derived/metric/<m>_*``: stats of reward metric ``m`` over the samples that report it, and
  ``derived/metric/<m>_gini_mean`` (the per-group Gini below, mean over groups).

Group homogeneity (per kept group, over its samples' completion lengths as above; then the mean
over the groups where the value is defined):

- ``derived/group_length_cv_mean``: coefficient of variation, pstdev / mean (0 when every length
  is 0);
- ``derived/group_length_gini_mean``: Gini coefficient, G = sum_i sum_j |x_i - x_j| / (2 n^2 mean)
  (0 when every value is 0); 0 for equal values, (n - 1) / n when one value holds everything;
- ``derived/group_length_max_median_ratio_mean``: max / median (undefined, so the group is left
  out, when the median is 0);
- ``derived/reward_gini_mean``: the Gini of the group's rewards. Gini needs non-negative values:
  when the group's smallest reward is negative every reward is first shifted by -min (so the
  smallest becomes 0), e.g. rewards (-1, 1) are read as (0, 2), G = 0.5.

Dropped groups (counted in groups, not samples):

- ``derived/discarded_count``; ``derived/discarded/<reason>_count`` for every reason present, and
  0 for ``max_async``, ``zero_advantage`` and ``off_policy`` when absent;
- ``derived/discarded_zero_advantage_pct`` / ``derived/discarded_max_async_pct``: 100 * such
  groups / discarded groups (no key without discarded groups);
- ``derived/discarded_zero_advantage_all_zero_pct`` / ``..._all_positive_pct``: among the
  zero-advantage groups, 100 * those whose rewards are all 0 / all > 0 (no key without such
  groups);
- ``derived/cancelled_count``: groups in ``batch.cancelled``.

Timings (``timings`` from the caller, seconds: ``step_s`` the step's wall time, ``train_s``,
``weight_sync_s``; no ``derived/timing/*`` key unless ``step_s`` > 0):

- ``derived/timing/train_pct`` = 100 * train_s / step_s, ``derived/timing/weight_sync_pct``
  likewise (a missing one counts as 0);
- ``derived/timing/idle_pct`` = 100 * max(0, step_s - train_s - weight_sync_s) / step_s;
- ``derived/timing/generation_pct`` = the mean over kept samples of
  min(100, 100 * sample.timings["generation_s"] / step_s) (samples without it left out; no key
  when none has it); ``derived/timing/reward_pct`` likewise from ``timings["reward_s"]``. This is
  the share of the step a typical kept sample spent generating (or being scored), not the share of
  the step during which anything was generating.

Only the standard library is used.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

DISCARD_REASONS = ("max_async", "zero_advantage", "off_policy")
"""Reasons whose count is reported even when 0."""


class SampleLike(Protocol):
    """The fields of ``ScoredSample`` read here."""

    @property
    def reward(self) -> float: ...
    @property
    def advantage(self) -> float: ...
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def completion_ids(self) -> Sequence[int]: ...
    @property
    def completion_mask(self) -> Sequence[int]: ...
    @property
    def is_truncated(self) -> bool: ...
    @property
    def off_policy_steps(self) -> int: ...
    @property
    def metrics(self) -> Mapping[str, float]: ...
    @property
    def timings(self) -> Mapping[str, float]: ...


class GroupLike(Protocol):
    """The fields of ``ScoredGroup`` read here."""

    @property
    def samples(self) -> Sequence[SampleLike]: ...


class DroppedLike(Protocol):
    """The fields of ``DroppedGroup`` read here."""

    @property
    def group(self) -> GroupLike: ...
    @property
    def reason(self) -> str: ...


class BatchLike(Protocol):
    """The fields of ``RolloutBatch`` read here."""

    @property
    def groups(self) -> Sequence[GroupLike]: ...
    @property
    def discarded(self) -> Sequence[DroppedLike]: ...
    @property
    def cancelled(self) -> Sequence[DroppedLike]: ...


def _finite(values: Iterable[float]) -> list[float]:
    return [float(v) for v in values if not math.isnan(float(v))]


def stats(prefix: str, values: Iterable[float]) -> dict[str, float]:
    """``{prefix}_mean/_std/_min/_max`` (population std) of ``values``; ``{}`` when empty."""
    xs = _finite(values)
    if not xs:
        return {}
    return {
        f"{prefix}_mean": statistics.fmean(xs),
        f"{prefix}_std": statistics.pstdev(xs),
        f"{prefix}_min": min(xs),
        f"{prefix}_max": max(xs),
    }


def gini(values: Sequence[float]) -> float | None:
    """Gini coefficient (see the module docstring; negatives shifted by -min); None when empty."""
    xs = _finite(values)
    if not xs:
        return None
    low = min(xs)
    if low < 0:
        xs = [x - low for x in xs]
    mean = statistics.fmean(xs)
    if mean == 0:
        return 0.0
    n = len(xs)
    # sum_i sum_j |x_i - x_j| = 2 * sum_k (2k - n + 1) x_(k) over the sorted values, k from 0
    pairs = 2 * sum((2 * k - n + 1) * x for k, x in enumerate(sorted(xs)))
    return pairs / (2 * n * n * mean)


def cv(values: Sequence[float]) -> float | None:
    """pstdev / mean of non-negative values (0 when all are 0); None when empty."""
    xs = _finite(values)
    if not xs:
        return None
    mean = statistics.fmean(xs)
    return 0.0 if mean == 0 else statistics.pstdev(xs) / mean


def max_median_ratio(values: Sequence[float]) -> float | None:
    """max / median; None when empty or the median is 0."""
    xs = _finite(values)
    if not xs:
        return None
    median = statistics.median(xs)
    return None if median == 0 else max(xs) / median


def completion_length(sample: SampleLike) -> int:
    """Model tokens of a sample: ``sum(completion_mask)``, or ``len(completion_ids)`` unmasked."""
    mask = sample.completion_mask
    return int(sum(mask)) if len(mask) else len(sample.completion_ids)


def _mean_defined(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def _put(out: dict[str, float], key: str, value: float | None) -> None:
    if value is not None:
        out[key] = float(value)


def _sample_metrics(samples: Sequence[SampleLike]) -> dict[str, float]:
    out: dict[str, float] = {}
    out |= stats("derived/reward", (s.reward for s in samples))
    out |= stats("derived/advantage", (s.advantage for s in samples))
    out |= stats("derived/length_completion", (completion_length(s) for s in samples))
    out |= stats("derived/length_prompt", (len(s.prompt_ids) for s in samples))
    out |= stats("derived/length_sum", (len(s.prompt_ids) + len(s.completion_ids) for s in samples))
    out |= stats("derived/off_policy_steps", (s.off_policy_steps for s in samples))
    for key in ("off_policy_steps_min", "off_policy_steps_max"):
        out.pop(f"derived/{key}", None)
    if samples:
        truncated = sum(1 for s in samples if s.is_truncated)
        out["derived/stop_reason_length_pct"] = 100.0 * truncated / len(samples)
    return out


def _group_metrics(groups: Sequence[GroupLike]) -> dict[str, float]:
    out: dict[str, float] = {}
    lengths = [[float(completion_length(s)) for s in g.samples] for g in groups]
    _put(out, "derived/group_length_cv_mean", _mean_defined(cv(x) for x in lengths))
    _put(out, "derived/group_length_gini_mean", _mean_defined(gini(x) for x in lengths))
    _put(
        out,
        "derived/group_length_max_median_ratio_mean",
        _mean_defined(max_median_ratio(x) for x in lengths),
    )
    rewards = (gini([s.reward for s in g.samples]) for g in groups)
    _put(out, "derived/reward_gini_mean", _mean_defined(rewards))
    names = sorted({m for g in groups for s in g.samples for m in s.metrics})
    for name in names:
        values = [s.metrics[name] for g in groups for s in g.samples if name in s.metrics]
        out |= stats(f"derived/metric/{name}", values)
        per_group = (gini([s.metrics[name] for s in g.samples if name in s.metrics]) for g in groups)
        _put(out, f"derived/metric/{name}_gini_mean", _mean_defined(per_group))
    return out


def _dropped_metrics(discarded: Sequence[DroppedLike], cancelled: Sequence[DroppedLike]) -> dict[str, float]:
    reasons = Counter(d.reason for d in discarded)
    out: dict[str, float] = {"derived/discarded_count": float(len(discarded))}
    for reason in sorted(set(reasons) | set(DISCARD_REASONS)):
        out[f"derived/discarded/{reason}_count"] = float(reasons.get(reason, 0))
    if discarded:
        for reason in ("zero_advantage", "max_async"):
            out[f"derived/discarded_{reason}_pct"] = 100.0 * reasons.get(reason, 0) / len(discarded)
    zero = [[s.reward for s in d.group.samples] for d in discarded if d.reason == "zero_advantage"]
    if zero:
        all_zero = sum(1 for r in zero if all(x == 0 for x in r))
        all_positive = sum(1 for r in zero if r and all(x > 0 for x in r))
        out["derived/discarded_zero_advantage_all_zero_pct"] = 100.0 * all_zero / len(zero)
        out["derived/discarded_zero_advantage_all_positive_pct"] = 100.0 * all_positive / len(zero)
    out["derived/cancelled_count"] = float(len(cancelled))
    return out


def _timing_metrics(samples: Sequence[SampleLike], timings: Mapping[str, float]) -> dict[str, float]:
    step = float(timings.get("step_s", 0.0) or 0.0)
    if not step > 0:
        return {}
    train = float(timings.get("train_s", 0.0) or 0.0)
    sync = float(timings.get("weight_sync_s", 0.0) or 0.0)
    out = {
        "derived/timing/train_pct": 100.0 * train / step,
        "derived/timing/weight_sync_pct": 100.0 * sync / step,
        "derived/timing/idle_pct": 100.0 * max(0.0, step - train - sync) / step,
    }
    for name in ("generation", "reward"):
        shares = [
            min(100.0, 100.0 * s.timings[f"{name}_s"] / step) for s in samples if f"{name}_s" in s.timings
        ]
        _put(out, f"derived/timing/{name}_pct", statistics.fmean(shares) if shares else None)
    return out


def derived_metrics(batch: BatchLike, *, timings: Mapping[str, float]) -> dict[str, float]:
    """Every ``derived/`` metric of one step (definitions in the module docstring)."""
    samples = [s for g in batch.groups for s in g.samples]
    out = _sample_metrics(samples)
    out |= _group_metrics(batch.groups)
    out |= _dropped_metrics(batch.discarded, batch.cancelled)
    out |= _timing_metrics(samples, timings)
    return out
