"""The FSDP backend's learning-rate scheduler: a ``LambdaLR`` over telescope-algos' ``lr_schedule``.

The schedules themselves (none, constant, linear, cosine; warmup; ``min_lr_ratio``) are
``telescope_algos.lr_multiplier`` (docs/algorithms.md#learning-rate-schedules); the first step of
a warmup trains with multiplier 0. The scheduler is a ``LambdaLR`` stepped once per train step
(not per minibatch); its state is saved in checkpoints and restored on resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from telescope_algos import LR_SCHEDULES as SCHEDULES
from telescope_algos import lr_multiplier
from telescope_algos.backend import lr_schedule

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

__all__ = ["SCHEDULES", "build_lr_scheduler", "lr_multiplier"]


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, config: TelescopeConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying the config's schedule (``telescope_algos.backend.lr_schedule``, which checks
    it first); ``none`` is a scheduler of constant 1.

    Building it sets the optimizer's learning rate to the multiplier of step 0.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(config))
