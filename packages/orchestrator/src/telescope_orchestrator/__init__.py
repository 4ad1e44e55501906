"""telescope-orchestrator: one Telescope run, from a resolved config to a finished record.

Four rooms, each with one purpose, imported downwards only (an import-linter layers contract):

- ``run``: the run's life: start-up, the loop, evals, checkpoints, the wiring of the packages;
- ``recovery``: keeping a run alive when a part dies (vLLM servers, trainer ranks);
- ``cluster``: processes only: Ray, the actors, the vLLM server launcher, the reaper and guard;
- ``record``: what a run writes and measures: the run directory, records, derived metrics, infra.

``docs/architecture.md`` draws them.
"""

from telescope_orchestrator.__about__ import __version__

__all__ = ["__version__"]
