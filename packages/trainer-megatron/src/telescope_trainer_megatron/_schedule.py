"""The learning-rate multiplier of every schedule (spec §1.8), as one pure function.

``s`` is the train step (0-based), ``W`` = ``warmup_steps``, ``T`` = ``number_of_steps`` and
ρ = ``min_lr_ratio``:

* ``none``: 1.
* ``constant``: ``s/W`` while s < W, then 1.
* ``linear``: warmup ``s/max(W,1)``, then ``1 − (1−ρ)·p`` with ``p = min((s−W)/max(T−W,1), 1)``.
* ``cosine``: warmup, then ``ρ + (1−ρ)·½(1 + cos πp)``.

The first step of a warmup trains with multiplier 0, as upstream does.
"""

from __future__ import annotations

import math

__all__ = ["lr_multiplier"]

SCHEDULES = ("none", "constant", "linear", "cosine")


def lr_multiplier(
    step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """Factor applied to ``learning_rate`` at train step ``step`` (module docstring)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr_scheduler {schedule!r}; known: {', '.join(SCHEDULES)}")
    if schedule == "none":
        return 1.0
    if step < warmup_steps:
        return step / max(warmup_steps, 1)
    if schedule == "constant":
        return 1.0
    p = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * p
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
