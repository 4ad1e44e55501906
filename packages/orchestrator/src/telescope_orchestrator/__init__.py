"""telescope-orchestrator: one Telescope run, from a config to a finished record.

``train(config)`` runs what ``telescope train`` runs, from a script or a notebook, and returns
a ``TrainResult``; ``evaluate(checkpoints)`` and ``convert_checkpoint`` are ``telescope eval``
and ``telescope convert``; ``Reporter`` is what shows a run's progress (the command's console is
one).
The run lives in four rooms, each with one purpose, imported downwards only (an import-linter
layers contract):

- ``run``: the run's life: start-up, the loop, evals, checkpoints, the wiring of the packages;
- ``recovery``: keeping a run alive when a part dies (vLLM servers, trainer ranks);
- ``cluster``: processes only: Ray, the actors, the vLLM server launcher, the reaper and guard;
- ``record``: what a run writes and measures: the run directory, records, derived metrics, infra.

``docs/architecture.md`` draws them.

The names below are imported on first use: the guard and the reaper run as
``python -m telescope_orchestrator.cluster.<module>``, and a root that imported the run would
import them before ``runpy`` runs them (a warning on every run's console, and a slower start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from telescope_orchestrator.__about__ import __version__

if TYPE_CHECKING:
    from telescope_orchestrator.cluster.vllm_server import ServerStartError
    from telescope_orchestrator.record.logging import configure_logging
    from telescope_orchestrator.record.rundir import RunDirError
    from telescope_orchestrator.run.api import StopTraining, TrainResult, resolve_config, train
    from telescope_orchestrator.run.checkpoints import CheckpointError, Converted, convert_checkpoint
    from telescope_orchestrator.run.models import SMOLLM2_ID, has_offline_copy, offline_model_config
    from telescope_orchestrator.run.report import Reporter, SilentReporter
    from telescope_orchestrator.run.standalone_eval import EvalError, EvalResult, evaluate
    from telescope_orchestrator.run.startup import TrainError

__all__ = [
    "__version__",
    # training from Python
    "train",
    "resolve_config",
    "TrainResult",
    "StopTraining",
    # evaluating and converting checkpoints
    "evaluate",
    "EvalResult",
    "convert_checkpoint",
    "Converted",
    # models: what can be read or run with no network
    "SMOLLM2_ID",
    "has_offline_copy",
    "offline_model_config",
    # what shows a run's progress
    "Reporter",
    "SilentReporter",
    # errors, each with a message that says what to do (besides ConfigError and RecordError)
    "TrainError",
    "RunDirError",
    "EvalError",
    "CheckpointError",
    "ServerStartError",
    # the one place that configures logging
    "configure_logging",
]

_HOMES = {
    "train": "run.api",
    "resolve_config": "run.api",
    "TrainResult": "run.api",
    "StopTraining": "run.api",
    "Reporter": "run.report",
    "SilentReporter": "run.report",
    "TrainError": "run.startup",
    "evaluate": "run.standalone_eval",
    "EvalResult": "run.standalone_eval",
    "EvalError": "run.standalone_eval",
    "convert_checkpoint": "run.checkpoints",
    "Converted": "run.checkpoints",
    "CheckpointError": "run.checkpoints",
    "SMOLLM2_ID": "run.models",
    "has_offline_copy": "run.models",
    "offline_model_config": "run.models",
    "ServerStartError": "cluster.vllm_server",
    "RunDirError": "record.rundir",
    "configure_logging": "record.logging",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (module docstring)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'telescope_orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"telescope_orchestrator.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, for ``dir()`` and completion."""
    return sorted(set(globals()) | set(__all__))
