"""The async rollout engine: environments and inference servers in, scored groups out.

:class:`RolloutEngine` keeps every server's lane slots busy, keeps the rollouts within
``max_async_rollout`` steps of the live weights, and hands out :class:`RolloutBatch` es of kept
groups (dropped ones ride along with their reason; each sample with its :class:`Turn` s), and
tells ``on_event`` about its :class:`EngineEvent` s. The caller gives the math: ``advantage_fn``
and, optionally, ``reward_shaping``. :meth:`RolloutEngine.progress` is the batch being filled as
it stands (a :class:`BatchProgress`, in words by :func:`progress_line`); ``engine.pool`` (a
:class:`ServerPool`) is its servers: which are in the pool, their weight versions, their lanes.
How it schedules is in docs/rollout.md, "The engine".
"""

from telescope_rollout.engine._engine import RolloutEngine, RolloutError
from telescope_rollout.engine._groups import AdvantageFn, RewardShaping
from telescope_rollout.engine._pool import ServerPool
from telescope_rollout.engine._progress import BatchProgress, RewardTally, progress_line
from telescope_rollout.engine._results import (
    DroppedGroup,
    EngineEvent,
    RolloutBatch,
    ScoredGroup,
    ScoredSample,
    TrainingSequence,
    Turn,
)
from telescope_rollout.engine._sampler import MultiEnvSampler, SamplerEntry
from telescope_rollout.engine._settings import EngineSettings, config_mismatches, config_values
from telescope_rollout.engine._tokens import TokenArray
from telescope_rollout.engine._watch import FailureWatch, unfit_environment

# the engine
__all__ = ["AdvantageFn", "EngineSettings", "RewardShaping", "RolloutEngine", "RolloutError", "ServerPool"]
# what it hands out (and tells the timeline)
__all__ += [
    "DroppedGroup",
    "EngineEvent",
    "RolloutBatch",
    "ScoredGroup",
    "ScoredSample",
    "TokenArray",
    "TrainingSequence",
    "Turn",
]
# how the batch being filled is going (``RolloutEngine.progress()``)
__all__ += ["BatchProgress", "RewardTally", "progress_line"]
# what it draws from
__all__ += ["MultiEnvSampler", "SamplerEntry"]
# hopeless input, settings from the config
__all__ += ["FailureWatch", "config_mismatches", "config_values", "unfit_environment"]
