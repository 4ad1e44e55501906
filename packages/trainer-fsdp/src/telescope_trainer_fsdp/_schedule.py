"""The FSDP backend's learning-rate scheduler: a ``LambdaLR`` over telescope-algos' ``lr_multiplier``.

The schedules themselves (none, constant, linear, cosine; warmup; ``min_lr_ratio``) are
documented and tested in ``telescope_algos.lr_multiplier``.

As in the original, the first step of a warmup trains with multiplier 0. The scheduler is a
``LambdaLR`` stepped once per train step (not per minibatch); its state is saved in checkpoints
and restored on resume (the original never restored it: spec §7 BUG).
"""

from __future__ import annotations

import functools

import torch

from telescope_algos import LR_SCHEDULES as SCHEDULES
from telescope_algos import lr_multiplier

__all__ = ["SCHEDULES", "build_lr_scheduler", "lr_multiplier"]


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_multiplier`; ``none`` is a scheduler of constant 1.

    Building it sets the optimizer's learning rate to the multiplier of step 0.
    """
    fn = functools.partial(
        lr_multiplier,
        schedule=schedule,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=min_lr_ratio,
    )
    fn(0)  # validate the arguments now, with a clear error, rather than inside LambdaLR
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
