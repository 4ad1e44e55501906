"""Training from Python: ``train(config)`` runs what ``telescope train`` runs, in this process.

::

    from telescope_orchestrator import StopTraining, train

    def watch(metrics):
        print(metrics["step"], metrics["reward/mean"])
        if metrics["reward/mean"] > 0.9:
            raise StopTraining("good enough")

    result = train("configs/run.yaml", overrides=["--number_of_steps", "20"], on_step=watch)
    print(result.run_dir, result.last_step, result.metrics["reward/mean"])

The config is a ``TelescopeConfig``, a ``ResolvedConfig``, a dict of fields (as in the YAML) or
the path of a run YAML; ``overrides`` are command-line style flags on top. The run is the same as
the command's: the same start-up phases, records, checkpoints and stop, every process it started
stopped on the way out (Ctrl-C included: ``KeyboardInterrupt`` reaches the caller once they are),
and the same errors with the same messages: ``ConfigError`` for a bad config, ``TrainError`` for
a run that cannot start or go on, ``RunDirError`` and ``RecordError`` for the run directory. A
program may train again after a run ends, in the same process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope_orchestrator.run.report import SilentReporter

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from telescope_config import ResolvedConfig, TelescopeConfig
    from telescope_orchestrator.run.report import PhaseHook, Reporter

__all__ = ["StopTraining", "TrainResult", "resolve_config", "train"]

StepCallback = Callable[[dict[str, Any]], None]


class StopTraining(Exception):
    """Raised by an ``on_step`` callback: the run stops after that step, with a checkpoint of it
    (when checkpoints are on), as if it had been its last."""


@dataclass(frozen=True)
class TrainResult:
    """What a finished run hands back."""

    run_dir: Path
    """The run directory: ``config.yaml``, ``metrics.jsonl``, ``records/``, ``checkpoints/``."""
    last_step: int
    """The last step trained (``number_of_steps`` unless the run was stopped early)."""
    metrics: dict[str, Any] = field(default_factory=dict[str, Any])
    """That step's metrics, as in ``metrics.jsonl`` (empty when no step ran, e.g. a finished
    run resumed)."""
    stopped_early: bool = False
    """True when an ``on_step`` callback's ``StopTraining`` stopped the run before its last step."""


def resolve_config(
    config: TelescopeConfig | ResolvedConfig | Mapping[str, Any] | str | os.PathLike[str],
    overrides: Sequence[str] = (),
) -> ResolvedConfig:
    """``config`` (see ``train``) with ``overrides`` as a validated ``ResolvedConfig``; a bad
    config raises ``ConfigError`` listing every problem, as ``telescope config validate`` does."""
    from telescope_config import ResolvedConfig, TelescopeConfig, defaults, load_config

    if isinstance(config, ResolvedConfig):
        if not overrides:
            return config
        return load_config(None, overrides, values=_user_values(config))
    if isinstance(config, TelescopeConfig):  # the user's fields: those that differ from the defaults
        base, values = defaults(), config.model_dump(mode="json")
        return load_config(None, overrides, values={k: v for k, v in values.items() if base.get(k) != v})
    if isinstance(config, str | os.PathLike):
        return load_config(config, overrides)
    return load_config(None, overrides, values=config)


def _user_values(resolved: ResolvedConfig) -> dict[str, Any]:
    """The fields a resolved config's user set, as a values layer."""
    values = resolved.to_dict()
    return {key: values[key] for key in resolved.user_keys if key in values}


class _Watched:
    """A reporter that also keeps the last step's metrics and hands them to ``on_step``."""

    def __init__(self, inner: Reporter, on_step: StepCallback | None) -> None:
        self.inner, self.on_step = inner, on_step
        self.metrics: dict[str, Any] = {}
        self.stop: StopTraining | None = None

    @property
    def on_phase(self) -> PhaseHook | None:
        return self.inner.on_phase

    @on_phase.setter
    def on_phase(self, hook: PhaseHook | None) -> None:
        self.inner.on_phase = hook

    def phase(self, text: str) -> AbstractContextManager[None]:
        return self.inner.phase(text)

    def info(self, text: str) -> None:
        self.inner.info(text)

    def warning(self, text: str) -> None:
        self.inner.warning(text)

    def start_training(self, first_step: int) -> None:
        self.inner.start_training(first_step)

    def step(self, metrics: dict[str, Any]) -> None:
        self.metrics = dict(metrics)
        self.inner.step(metrics)
        if self.on_step is not None and self.stop is None:
            try:
                self.on_step(dict(metrics))
            except StopTraining as stop:
                self.stop = stop

    def waiting(self, step: int, waited_s: float, line: str, *, plain: bool) -> None:
        self.inner.waiting(step, waited_s, line, plain=plain)

    def close(self) -> None:
        self.inner.close()


def train(
    config: TelescopeConfig | ResolvedConfig | Mapping[str, Any] | str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
    on_step: StepCallback | None = None,
    reporter: Reporter | None = None,
    debug: bool = False,
) -> TrainResult:
    """Run a whole training job from ``config`` (module docstring) in this process.

    ``run_dir``: the run directory (default: a new one under ``./runs``, or the checkpoint's run
    when resuming, as the command chooses); ``on_step(metrics)``: called after each step with its
    metrics (raise ``StopTraining`` to stop there; any other exception stops the run as an error,
    like a crash after that step: its record is written, a checkpoint due at it may not be; the
    callback runs on the run's event loop, so keep it short); ``reporter``: what shows the run's progress
    (default: nothing; ``telescope_cli.console.Console`` is the command's); ``debug``: debug logs.
    """
    from telescope_orchestrator.run.checks import cpu_torch_conflict
    from telescope_orchestrator.run.startup import TrainError
    from telescope_orchestrator.run.startup import train as run_train

    resolved = resolve_config(config, overrides)
    problem = cpu_torch_conflict()
    if problem is not None:
        raise TrainError(problem)
    watched = _Watched(reporter if reporter is not None else SilentReporter(), on_step)
    done = run_train(
        resolved,
        reporter=watched,
        run_dir=None if run_dir is None else str(run_dir),
        debug=debug or bool(resolved.config.debug),
        stop_requested=lambda: watched.stop is not None,
    )
    return TrainResult(done.run_dir, done.last_step, watched.metrics, stopped_early=done.stopped)
