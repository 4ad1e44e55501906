"""Learning-rate schedules: a pure multiplier of ``learning_rate`` per train step.

In words: docs/algorithms.md#learning-rate-schedules.

Shared by every training backend (FSDP wraps it in a ``LambdaLR``; Megatron sets the learning
rate of its optimizer groups from it). ``s`` is the 0-based index of the train step, ``W`` the
warmup steps, ``T`` the run's total steps (``number_of_steps``) and ρ the ``min_lr_ratio``:

* ``none``: always 1 (warmup ignored).
* ``constant``: ``s/W`` while ``s < W``, then 1.
* ``linear``: warmup, then ``1 − (1−ρ)·p`` with ``p = min((s−W)/max(T−W, 1), 1)``.
* ``cosine``: warmup, then ``ρ + (1−ρ)·½(1 + cos πp)``.

The first step of a warmup trains with multiplier 0 (``s = 0``).
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("none", "constant", "linear", "cosine")


def lr_multiplier(
    step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """Multiplier of the peak learning rate at train step ``step`` (0-based); see the module docstring."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_scheduler {schedule!r}; known: {', '.join(LR_SCHEDULES)}")
    if step < 0 or warmup_steps < 0 or total_steps < 1:
        raise ValueError(
            "need step >= 0, warmup_steps >= 0 and total_steps >= 1, "
            f"got {step}, {warmup_steps}, {total_steps}"
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if schedule == "none":
        return 1.0
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
