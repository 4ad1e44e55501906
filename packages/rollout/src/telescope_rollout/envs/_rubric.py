"""Rubric: weighted composition of reward functions.

A reward function declares the keywords it wants among ``completion``, ``sample``, ``state`` and
``eos_token`` (or ``**kwargs`` for all non-None ones), may be sync or async, and returns a number or
``(number, golden_answer)``. A raising function scores 0.0 and logs a warning: one bad sample must
not stop a run.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import structlog

from telescope_rollout._types import RewardResult
from telescope_rollout.envs._env import maybe_await

_ARGS = ("completion", "sample", "state", "eos_token")
log = structlog.get_logger()


@dataclass
class RewardFunc:
    """One registered function with its weight (0 for metric-only entries) and display range."""

    func: Callable[..., Any]
    weight: float
    name: str
    golden_answer: str | None = None
    range_min: float | None = None
    range_max: float | None = None
    invert: bool = False

    def wanted(self, available: dict[str, Any]) -> dict[str, Any]:
        params = inspect.signature(self.func).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return {k: v for k, v in available.items() if v is not None}
        return {k: available[k] for k in _ARGS if k in params}


class Rubric:
    """An ordered list of reward functions; ``score`` sums ``weight * score`` over them."""

    def __init__(self) -> None:
        self.funcs: list[RewardFunc] = []

    def add_reward(
        self,
        func: Callable[..., Any],
        weight: float = 1.0,
        *,
        name: str | None = None,
        golden_answer: str | None = None,
        range_min: float | None = None,
        range_max: float | None = None,
        invert: bool = False,
    ) -> Rubric:
        name = name or str(getattr(func, "__name__", "reward"))
        if any(f.name == name for f in self.funcs):
            raise ValueError(f"rubric already has a function named {name!r}; pass name=... to rename")
        self.funcs.append(RewardFunc(func, float(weight), name, golden_answer, range_min, range_max, invert))
        return self

    def add_metric(self, func: Callable[..., Any], **kwargs: Any) -> Rubric:
        """Record a function's value as a metric only (weight 0)."""
        return self.add_reward(func, 0.0, **kwargs)

    @property
    def metrics_ranges(self) -> dict[str, dict[str, Any]]:
        """``{name: {min, max, invert}}`` for every function registered with a range."""
        return {
            f.name: {"min": f.range_min, "max": f.range_max, "invert": f.invert}
            for f in self.funcs
            if f.range_min is not None or f.range_max is not None
        }

    @property
    def max_reward(self) -> float | None:
        """Σ weight·range_max over weighted functions, when every one has a range."""
        best: list[float] = []
        for f in self.funcs:
            if not f.weight:
                continue
            if f.range_max is None or f.range_min is None:
                return None
            best.append(f.weight * (f.range_max if f.weight > 0 else f.range_min))
        return sum(best) if best else None

    async def _call(self, f: RewardFunc, available: dict[str, Any]) -> tuple[float, str | None]:
        try:
            out = await maybe_await(f.func(**f.wanted(available)))
        except Exception as exc:
            log.warning("reward_function_failed", reward=f.name, error=f"{type(exc).__name__}: {exc}")
            return 0.0, f.golden_answer
        golden = f.golden_answer
        if isinstance(out, tuple):
            pair = cast(tuple[Any, ...], out)
            out, golden = pair[0], (None if pair[1] is None else str(pair[1]))
        try:
            value = float(out)
        except (TypeError, ValueError):
            log.warning("reward_function_bad_return", reward=f.name, value=repr(out)[:200])
            return 0.0, golden
        if not math.isfinite(value):
            log.warning("reward_function_not_finite", reward=f.name, value=value)
            value = 0.0
        return value, golden

    async def score(
        self,
        completion: str | None = None,
        sample: Any = None,
        state: Any = None,
        eos_token: str | None = None,
        *,
        extra_metrics: dict[str, float] | None = None,
        extra_golden_answers: dict[str, str | None] | None = None,
        info_turns: list[dict[str, Any]] | None = None,
        sample_tags: dict[str, str] | None = None,
    ) -> RewardResult:
        """Run every function (in order) and build the RewardResult."""
        available = {"completion": completion, "sample": sample, "state": state, "eos_token": eos_token}
        total = 0.0
        metrics: dict[str, float] = {}
        golden: dict[str, str | None] = {}
        for f in self.funcs:
            value, gold = await self._call(f, available)
            metrics[f.name] = value
            if gold is not None:
                golden[f.name] = gold
            total += f.weight * value
        metrics.update(extra_metrics or {})
        golden.update(extra_golden_answers or {})
        return RewardResult(
            total_reward=total,
            sample_metrics=metrics,
            golden_answers=golden,
            info_turns=list(info_turns or []),
            sample_tags=dict(sample_tags or {}),
        )
