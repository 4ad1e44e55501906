"""In-training evals in the loop: when they run, on which servers, where results go.

The loop talks to one object, :class:`InTrainingEvals`: ``before_training()`` once, then
``publish(step)`` (the weight sync of a trained step, which depends on the evals) and
``after_step(step)`` each step, and ``close()`` at the end.

Schedule (steps counted from 1, as in metrics; "after step s" means once step s's weights are
live on the servers, so the eval measures the policy of step s):

* baseline at step 0, before the first rollout, when ``eval_before_training`` (not on resume);
* periodic after step s when ``s % eval_every == 0``, only with ``eval_num_servers > 0`` (0
  disables them, as documented in the config);
* final after the last step when ``eval_after_training``, for the evals not already run there.

Servers: the baseline and the final evals use every server when ``eval_start_end_use_all_servers``
or when no server is reserved (nothing trains then), else the last ``eval_num_servers``; nothing
trains while they run. Periodic evals run on the last ``eval_num_servers`` servers (the eval
servers) while training goes on (README "Evals"), see :class:`PeriodicEval`:

1. after step s's weights went to every server (weight group ``full``), the eval servers are
   drained from the rollout engine (their in-flight training groups are cancelled, reason
   ``eval_drain``) and the evals start on them in the background;
2. later steps train on rollouts of the other servers and publish on the ``training_only`` group
   (trainer + the other servers): the eval servers keep step s's weights;
3. at the first publish after the evals finished, the weights go to the ``full`` group again and
   the eval servers rejoin the training pool. A new eval step waits for the running evals first
   (training pauses only then), as does the last step.

Records: the ``eval_samples`` table of the run's record (docs/records.md; one row per completion,
with its turns, tool calls and rollout events), and
the aggregates as ``eval/<eval>/<metric>`` plus ``eval/step`` (the step whose weights were
evaluated) in ``metrics.jsonl`` and W&B, one console line per eval. Every eval gets a line of its
own with ``step`` = the evaluated step, written when it finishes: a periodic eval's line comes
after the lines of the steps trained meanwhile, the final evals' line is the last of the run
(after the last step's line and checkpoint, so an eval never costs a trained step). In W&B they
are logged at the current step, and charted against ``eval/step``.

Failures: an eval that fails (it raised, its servers could not be reached, or it ran past the
runner's time limit) is logged as a warning and recorded as ``eval/<eval>/failed: 1`` in its
line; training goes on, and drained eval servers rejoin as usual. Only cancellation (Ctrl-C)
stops the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from telescope_orchestrator.record.rundir import RunDir

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig
    from telescope_orchestrator.record.lines import MetricsLines
    from telescope_orchestrator.run.report import Reporter
    from telescope_orchestrator.run.weights import Group, WeightUpdates
    from telescope_rollout import EvalRunner, RolloutEngine

__all__ = [
    "EvalPlan",
    "InTrainingEvals",
    "PeriodicEval",
    "eval_metrics",
    "eval_servers",
    "failed_metrics",
    "run_scheduled_evals",
]

log = structlog.get_logger()


@dataclass(frozen=True)
class EvalPlan:
    """Which evals run after which step; see the module docstring."""

    every: tuple[tuple[str, int], ...]
    """(name, eval_every) in config order."""
    number_of_steps: int
    start_step: int = 0
    before: bool = True
    after: bool = True
    periodic: bool = True

    @classmethod
    def from_config(cls, cfg: TelescopeConfig, start_step: int = 0) -> EvalPlan:
        return cls(
            every=tuple((e.name, int(e.eval_every)) for e in cfg.evals),
            number_of_steps=int(cfg.number_of_steps),
            start_step=start_step,
            before=bool(cfg.eval_before_training),
            after=bool(cfg.eval_after_training),
            periodic=int(cfg.eval_num_servers) > 0,
        )

    def baseline(self) -> list[str]:
        """Evals to run before the first step (none when resuming)."""
        return [n for n, _ in self.every] if self.before and self.start_step == 0 else []

    def after_step(self, step: int) -> list[str]:
        """Evals to run once step ``step`` (from 1) is trained and its weights are live."""
        names = [n for n, every in self.every if self.periodic and step % every == 0]
        if self.after and step == self.number_of_steps:
            names += [n for n, _ in self.every if n not in names]
        return names


def eval_servers(
    urls: Sequence[str], *, eval_num_servers: int, use_all_at_ends: bool, end: bool
) -> list[str]:
    """The servers an eval runs on; ``end`` marks the baseline and the final evals."""
    urls = list(urls)
    if eval_num_servers <= 0 or (end and use_all_at_ends):
        return urls
    return urls[-min(eval_num_servers, len(urls)) :]


@dataclass
class PeriodicEval:
    """Evals of one step running in the background on drained eval servers.

    ``task`` returns the ``eval/...`` metrics (already written by then); ``servers`` are the eval
    servers, out of the rollout engine's pool until the loop gives them the current weights.
    """

    step: int
    servers: list[str]
    task: asyncio.Task[dict[str, float]]

    @classmethod
    async def start(
        cls,
        engine: Any,
        step: int,
        servers: list[str],
        evals: Callable[[], Coroutine[Any, Any, dict[str, float]]],
    ) -> PeriodicEval:
        """Drain ``servers`` from ``engine`` (cancelling their rollouts), then run ``evals()`` (runs
        the evals and records the results) as a task."""
        cancelled = await engine.drain_servers(servers, reason="eval_drain")
        log.info("eval servers drained", step=step, servers=servers, cancelled_groups=cancelled)
        return cls(step, list(servers), asyncio.create_task(evals(), name=f"evals-step-{step}"))

    def done(self) -> bool:
        return self.task.done()

    async def wait(self) -> dict[str, float]:
        """The metrics (the evals' failures are in them, see the module docstring)."""
        return await self.task

    async def cancel(self, timeout_s: float = 30.0) -> None:
        """Stop the evals (the run is ending early); their error, if any, is only logged."""
        if not self.task.done():
            self.task.cancel()
            await asyncio.wait([self.task], timeout=timeout_s)
        if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
            log.warning("periodic evals failed", step=self.step, error=repr(self.task.exception()))


def eval_metrics(results: Sequence[Any]) -> dict[str, float]:
    """``eval/<eval>/<metric>`` for every aggregate of every result (``failed: 1`` for a failed one)."""
    out = {f"eval/{r.name}/{k}": float(v) for r in results for k, v in r.metrics.items()}
    out.update({f"eval/{r.name}/failed": 1.0 for r in results if getattr(r, "error", "")})
    return out


def failed_metrics(names: Sequence[str], step: int) -> dict[str, float]:
    """The record of evals that failed as a whole."""
    return {**{f"eval/{n}/failed": 1.0 for n in names}, "eval/step": step}


def console_line(result: Any) -> str:
    """``eval math500 @ step 10: correct 0.425  pass@4/correct 0.610  (40 completions, 12.3 s)``."""
    if getattr(result, "error", ""):
        return f"eval {result.name} @ step {result.step}: FAILED ({result.error[:200]})"
    m = result.metrics
    main = result.main_metric
    parts = [f"{main} {m[main]:.3f}"] if main else []
    if main:
        parts += [
            f"{k} {v:.3f}"
            for k, v in m.items()
            if k.startswith(("pass@", "pass^")) and k.endswith(f"/{main}")
        ]
    errors = f", {int(m.get('errors', 0))} failed" if m.get("errors") else ""
    return (
        f"eval {result.name} @ step {result.step}: {'  '.join(parts) or 'no metrics'}  "
        f"({int(m.get('completions', 0))} completions{errors}, {m.get('time_s', 0.0):.1f} s)"
    )


async def run_scheduled_evals(
    runner: Any, run: RunDir, console: Any, *, step: int, names: list[str], servers: list[str]
) -> dict[str, float]:
    """Run ``names`` at ``step`` on ``servers``, write their tables, print one line each.

    Returns the ``eval/...`` metrics for the evals' metrics line. Never raises for a failed eval
    (it is logged and recorded as ``eval/<eval>/failed: 1``); cancellation propagates.
    """
    if not names:
        return {}
    t0, started = time.monotonic(), time.time()
    log.info("evals start", step=step, evals=names, servers=len(servers))
    try:
        results = await runner.run(step=step, names=names, servers=servers)
    except Exception as exc:
        for name in names:
            log.warning("eval failed", eval=name, step=step, error=f"{type(exc).__name__}: {exc}")
            run.records.event(
                "eval", step, duration_s=time.monotonic() - t0, at=started, eval=name, failed=True
            )
            console.info(f"eval {name} @ step {step}: FAILED ({type(exc).__name__}: {str(exc)[:200]})")
        return failed_metrics(names, step)
    for r in results:
        if r.rows:
            try:
                run.records.write_eval(r)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.warning("eval records not written", eval=r.name, step=step, error=error)
        run.records.event(
            "eval",
            step,
            duration_s=time.monotonic() - t0,
            at=started,
            eval=r.name,
            servers=list(servers),
            failed=bool(getattr(r, "error", "")),
        )
        console.info(console_line(r))
    metrics = {**eval_metrics(results), "eval/step": step} if results else {}
    log.info("evals done", step=step, seconds=round(time.monotonic() - t0, 2), **metrics)
    return metrics


class InTrainingEvals:
    """The evals of a training run around its steps, and the weight sync that depends on them.

    Without evals in the config it only publishes (to the ``full`` group). See the module docstring
    for the schedule and the server choreography.
    """

    def __init__(
        self,
        config: TelescopeConfig,
        *,
        runner: EvalRunner | None,
        engine: RolloutEngine,
        weights: WeightUpdates,
        lines: MetricsLines,
        run: RunDir,
        console: Reporter,
        start_step: int = 0,
    ) -> None:
        self.config, self.runner, self.engine, self.weights = config, runner, engine, weights
        self.lines, self.run, self.console, self.start_step = lines, run, console, start_step
        self.plan = EvalPlan.from_config(config, start_step) if runner is not None else None
        self.running: PeriodicEval | None = None
        """The periodic evals running in the background, until a publish takes their servers back."""
        if self.plan is not None and self.plan.periodic and "training_only" not in weights.groups:
            raise ValueError(
                f"periodic evals need a server left for training: eval_num_servers is "
                f"{config.eval_num_servers} with {len(weights.servers)} server(s); lower "
                "eval_num_servers or add inference workers"
            )

    @property
    def idle(self) -> bool:
        """No eval is using a server (periodic evals run in the background)."""
        return self.running is None or self.running.done()

    def due(self, step: int) -> list[str]:
        return self.plan.after_step(step) if self.plan is not None else []

    async def before_training(self) -> None:
        """The baseline evals, then those a resumed checkpoint never finished (its weights are live)."""
        if self.plan is None:
            return
        if self.plan.baseline():
            self.record(0, await self._run(0, self.plan.baseline(), end=True))
        start = self.start_step
        if start and self.plan.after_step(start) and not self._recorded(start):
            self.record(start, await self._run(start, self.plan.after_step(start), end=True))

    async def publish(self, step: int) -> dict[str, float]:
        """Send step ``step``'s weights to the servers that train (every server unless periodic evals
        hold theirs), tell the engine, and take finished eval servers back; returns the sync metrics.

        A new eval step, or the last step, first waits for running evals (``timing/eval_s``).
        """
        due = self.due(step)
        last = step == self.config.number_of_steps
        t0 = time.monotonic()
        rejoin: list[str] = []
        running = self.running
        if running is not None and (running.done() or due or last):
            await running.wait()
            rejoin, self.running = running.servers, None
        t_wait = time.monotonic() - t0
        group: Group = "full" if self.running is None else "training_only"
        metrics = await self.weights.publish(step, group)
        if rejoin and not (due and not last):  # back to training, unless a new periodic eval takes them
            self.engine.restore_servers(rejoin)
        return {
            **{f"weight_sync/{k}": v for k, v in metrics.items()},
            "timing/weight_sync_s": time.monotonic() - t0 - t_wait,
            "timing/eval_s": t_wait,
            "weight_sync/training_only": float(group == "training_only"),
        }

    async def after_step(self, step: int) -> None:
        """Start the periodic evals due after ``step`` in the background, or run the final ones."""
        due = self.due(step)
        if not due:
            return
        if step == self.config.number_of_steps:
            await self.engine.stop()  # nothing more to train: the final evals get their servers alone
            self.record(step, await self._run(step, due, end=True))
            return
        servers = self._servers(end=False)
        self.running = await PeriodicEval.start(
            self.engine, step, servers, lambda: self._in_background(step, due)
        )

    async def close(self) -> None:
        """Cancel periodic evals still running (the run ends early)."""
        running, self.running = self.running, None
        if running is not None:
            await running.cancel()

    def record(self, step: int, eval_results: dict[str, float]) -> None:
        """The metrics line of the evals of ``step`` (baseline, periodic or final): a line of its own.

        W&B cannot go back to an earlier step: a periodic eval that ends after later steps were
        logged goes to the latest one (its ``eval/step`` says which weights it measured).
        """
        if eval_results:
            self.lines.write(eval_results, step=step, file_only={"step": step, "time": time.time()})

    def _recorded(self, step: int) -> bool:
        """True when metrics.jsonl already holds an eval line for ``step`` (its evals ran, or failed)."""
        return any(m.get("eval/step") == step for m in self.run.read_metrics())

    def _servers(self, *, end: bool) -> list[str]:
        cfg = self.config
        return eval_servers(
            self.weights.servers,
            eval_num_servers=int(cfg.eval_num_servers),
            use_all_at_ends=bool(cfg.eval_start_end_use_all_servers),
            end=end,
        )

    async def _run(self, step: int, names: list[str], *, end: bool) -> dict[str, float]:
        return await run_scheduled_evals(
            self.runner, self.run, self.console, step=step, names=names, servers=self._servers(end=end)
        )

    async def _in_background(self, step: int, names: list[str]) -> dict[str, float]:
        """A periodic eval's body: run, then record its metrics line as soon as it is done.

        Never raises but for cancellation: a failure is logged and recorded (``eval/<name>/failed``),
        so the loop takes the eval servers back and trains on.
        """
        try:
            results = await self._run(step, names, end=False)
        except Exception as exc:  # run_scheduled_evals records failures itself; this is a last resort
            for name in names:
                log.warning("eval failed", eval=name, step=step, error=f"{type(exc).__name__}: {exc}")
            results = failed_metrics(names, step)
        try:
            self.record(step, results)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("eval metrics not recorded", step=step, evals=names, error=error)
        return results
