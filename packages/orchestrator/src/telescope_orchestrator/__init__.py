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
"""

from telescope_orchestrator.__about__ import __version__
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
