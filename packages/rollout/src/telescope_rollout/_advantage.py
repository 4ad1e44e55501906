"""Pure-python group advantages and reward shaping (spec §3.1, §3.8), for torch-free callers.

``group_advantages`` is the group stage of the config's algorithm; the batch stage of
``advantage_norm: batch`` (whitening over the whole step) belongs to the training loop. These
match telescope_algos' torch versions (std with ddof=1, eps 1e-4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

EPS = 1e-4
ZERO_ADVANTAGE_TOL = 1e-9

AdvantageFn = Callable[[list[float]], list[float]]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def grpo(rewards: Sequence[float], eps: float = EPS) -> list[float]:
    """``(r_i - mean) / (std + eps)``."""
    m, s = _mean(rewards), _std(rewards)
    return [(r - m) / (s + eps) for r in rewards]


def rloo(rewards: Sequence[float]) -> list[float]:
    """``(r_i - mean) * n / (n - 1)`` = r_i minus the mean of the others; 0 for a group of one."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    m = _mean(rewards)
    return [(r - m) * n / (n - 1) for r in rewards]


def centered(rewards: Sequence[float]) -> list[float]:
    """``r_i - mean``; a group of one keeps its raw reward (batch-normalised modes)."""
    if len(rewards) < 2:
        return [float(r) for r in rewards]
    m = _mean(rewards)
    return [r - m for r in rewards]


def advantage_fn_for(algorithm: str = "grpo", advantage_norm: str = "group") -> AdvantageFn:
    """The group-stage advantage of ``algorithm`` under ``advantage_norm``."""
    if algorithm == "rloo":
        return rloo
    if algorithm == "dr_grpo":
        return lambda r: [x - _mean(r) for x in r]
    if algorithm == "reinforce_pp" or advantage_norm == "batch":
        return centered
    if algorithm in ("grpo", "cispo", "gspo", "sapo"):
        return grpo
    raise ValueError(
        f"unknown algorithm {algorithm!r}: use grpo, rloo, dr_grpo, reinforce_pp, cispo, gspo or sapo, "
        "or pass advantage_fn= to the engine"
    )


def is_zero_advantage(advantages: Sequence[float], tol: float = ZERO_ADVANTAGE_TOL) -> bool:
    """True when a group of more than one sample has all advantages equal within ``tol``."""
    return len(advantages) > 1 and max(advantages) - min(advantages) <= tol


def overlong_penalty(num_tokens: int, *, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO soft overlong penalty (<= 0) added to the reward: ``-(L - (Lmax - B)) / B * factor``
    once ``L > Lmax - B``; 0 when ``factor`` is 0."""
    if factor <= 0 or buffer <= 0:
        return 0.0
    excess = num_tokens - (max_tokens - buffer)
    return min(-excess / buffer * factor, 0.0) if excess > 0 else 0.0
