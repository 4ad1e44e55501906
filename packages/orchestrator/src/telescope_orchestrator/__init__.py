"""telescope-orchestrator: one Telescope run, from a config to a finished record.

``train(config)`` runs what ``telescope train`` runs, from a script or a notebook, and returns
a ``TrainResult``; ``Reporter`` is what shows a run's progress (the command's console is one).
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
    from telescope_orchestrator.record.logging import configure_logging
    from telescope_orchestrator.record.rundir import RunDirError
    from telescope_orchestrator.run.api import StopTraining, TrainResult, resolve_config, train
    from telescope_orchestrator.run.report import Reporter, SilentReporter
    from telescope_orchestrator.run.startup import TrainError

__all__ = [
    "__version__",
    # training from Python
    "train",
    "resolve_config",
    "TrainResult",
    "StopTraining",
    # what shows a run's progress
    "Reporter",
    "SilentReporter",
    # errors a run stops with (besides telescope_config.ConfigError and telescope_records.RecordError)
    "TrainError",
    "RunDirError",
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
