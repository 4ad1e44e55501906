"""Learning-rate multipliers by hand: W = 2 warmup steps, T = 6 steps, ρ = 0.1.

The schedules: docs/algorithms.md#learning-rate-schedules.
"""

from __future__ import annotations

import math

import pytest

from telescope_algos import lr_multiplier


def _lr(step: int, schedule: str) -> float:
    return lr_multiplier(step, schedule=schedule, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)


def test_warmup_starts_at_zero_and_none_ignores_it():
    assert [_lr(s, "constant") for s in range(4)] == [0.0, 0.5, 1.0, 1.0]
    assert [_lr(s, "none") for s in range(3)] == [1.0, 1.0, 1.0]


def test_linear_decays_to_the_floor():
    # after warmup p = (s - 2) / 4: s=2 -> 1, s=4 -> 1 - 0.9 * 0.5 = 0.55, s=6 and later -> 0.1
    assert _lr(2, "linear") == pytest.approx(1.0)
    assert _lr(4, "linear") == pytest.approx(0.55)
    assert _lr(6, "linear") == pytest.approx(0.1)
    assert _lr(9, "linear") == pytest.approx(0.1)


def test_cosine_halfway_is_the_midpoint():
    # s=4: p = 0.5, 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55; s=3: p = 0.25
    assert _lr(4, "cosine") == pytest.approx(0.55)
    assert _lr(3, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="unknown lr_scheduler 'step'"):
        _lr(0, "step")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        lr_multiplier(0, schedule="linear", warmup_steps=0, total_steps=5, min_lr_ratio=2.0)
