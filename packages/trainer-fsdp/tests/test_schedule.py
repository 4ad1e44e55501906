"""LR schedules against hand-worked values (docs/algorithms.md#learning-rate-schedules)."""

import math

import pytest
import torch

from telescope_config.testing import make_config
from telescope_trainer_fsdp import lr_multiplier
from telescope_trainer_fsdp._schedule import build_lr_scheduler


def mult(schedule, step, warmup=2, total=10, rho=0.1):
    return lr_multiplier(step, schedule=schedule, warmup_steps=warmup, total_steps=total, min_lr_ratio=rho)


@pytest.mark.parametrize(
    ("step", "expected"),
    [(0, 0.0), (1, 0.5), (2, 1.0), (9, 1.0), (50, 1.0)],  # s/W while s < W (W=2), then flat
)
def test_constant_warms_up_then_stays_flat(step, expected):
    assert mult("constant", step) == pytest.approx(expected)


def test_constant_without_warmup_and_none_start_at_the_peak():
    assert mult("constant", 0, warmup=0) == 1.0
    assert mult("none", 0) == 1.0  # none ignores the warmup
    assert mult("none", 7) == 1.0


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),
        (1, 0.5),
        (2, 1.0),  # p = 0
        (6, 0.55),  # p = (6-2)/(10-2) = 0.5 -> 1 - 0.9*0.5
        (10, 0.1),  # p = 1 -> rho
        (20, 0.1),  # p clamped at 1
    ],
)
def test_linear_decays_to_min_lr_ratio(step, expected):
    assert mult("linear", step) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (1, 0.5),
        (2, 1.0),  # 0.1 + 0.9 * 0.5 * (1 + cos 0)
        (4, 0.1 + 0.9 * 0.5 * (1 + math.sqrt(0.5))),  # p = 0.25, cos(pi/4) = 0.7071 -> 0.868198
        (6, 0.55),  # p = 0.5, cos(pi/2) = 0
        (10, 0.1),  # p = 1, cos(pi) = -1
    ],
)
def test_cosine_follows_half_a_cosine(step, expected):
    assert mult("cosine", step) == pytest.approx(expected)
    if step == 4:
        assert mult("cosine", step) == pytest.approx(0.868198, abs=1e-6)


def test_total_steps_not_after_warmup_does_not_divide_by_zero():
    # W=5 >= T=3: max(T-W, 1) = 1, so p = s - W
    assert mult("linear", 5, warmup=5, total=3, rho=0.2) == pytest.approx(1.0)
    assert mult("linear", 6, warmup=5, total=3, rho=0.2) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"schedule": "step"}, "unknown lr_scheduler"),
        ({"step": -1}, "step >= 0"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
        ({"total_steps": 0}, "total_steps >= 1"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    args = {"step": 0, "schedule": "linear", "warmup_steps": 0, "total_steps": 10, "min_lr_ratio": 0.0}
    args.update(kwargs)
    step = args.pop("step")
    with pytest.raises(ValueError, match=match):
        lr_multiplier(step, **args)


def test_scheduler_sets_the_optimizer_lr_once_per_step():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.2)
    config = make_config(lr_scheduler="linear", warmup_steps=2, number_of_steps=10, min_lr_ratio=0.1)
    sched = build_lr_scheduler(opt, config)
    seen = []
    for _ in range(7):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # 0.2 x [0, 0.5, 1, 1-0.9/8, 1-0.9*2/8, 1-0.9*3/8, 1-0.9*4/8]
    expected = [0.0, 0.1, 0.2, 0.1775, 0.155, 0.1325, 0.11]
    assert seen == pytest.approx(expected)
