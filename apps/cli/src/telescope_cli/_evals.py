"""In-training evals in the loop (spec §6.1): when they run, on which servers, where results go.

Schedule (steps counted from 1, as in metrics; "after step s" means once step s's weights are
live on the servers, so the eval measures the policy of step s):

* baseline at step 0, before the first rollout, when ``eval_before_training`` (not on resume);
* periodic after step s when ``s % eval_every == 0`` (the original's ``(s+1) % eval_every`` on
  0-indexed steps), only with ``eval_num_servers > 0`` (0 disables them, as documented in the
  config);
* final after the last step when ``eval_after_training``, for the evals not already run there.

Servers: the baseline and the final evals use every server when ``eval_start_end_use_all_servers``
or when no server is reserved (nothing trains then), else the last ``eval_num_servers``; periodic
evals use the last ``eval_num_servers``. The loop waits for an eval before the next training step,
so the weights cannot change under it. The rollout engine keeps generating on all servers
meanwhile (up to ``max_async_rollout`` batches ahead), so periodic evals share their servers with
rollout requests. TODO(spec §1.9, §6.1): drain the eval servers and keep training on the others
with a ``training_only`` weight group, as the original does.

Records: ``evals/<eval>/step_NNNNNN.parquet`` (one row per completion) in the run directory, and
the aggregates as ``eval/<eval>/<metric>`` in that step's ``metrics.jsonl`` line (step 0 gets a
line of its own) and in W&B; one console line per eval.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from telescope_cli._rundir import RunDir

__all__ = ["EvalPlan", "eval_metrics", "eval_servers", "run_scheduled_evals", "write_eval_rows"]

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
    def from_config(cls, cfg: Any, start_step: int = 0) -> EvalPlan:
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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def write_eval_rows(run: RunDir, name: str, step: int, rows: list[dict[str, Any]]) -> Path:
    """One eval's rows at one step as ``evals/<eval>/step_NNNNNN.parquet`` (zstd)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = run.path / "evals" / _safe(name)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"step_{step:06d}.parquet"
    table = pa.Table.from_pylist(rows)
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(out)
    return out


def eval_metrics(results: Sequence[Any]) -> dict[str, float]:
    """``eval/<eval>/<metric>`` for every aggregate of every result."""
    return {f"eval/{r.name}/{k}": float(v) for r in results for k, v in r.metrics.items()}


def console_line(result: Any) -> str:
    """``eval math500 @ step 10: correct 0.425  pass@4/correct 0.610  (40 completions, 12.3 s)``."""
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

    Returns the ``eval/...`` metrics to merge into the step's metrics line.
    """
    if not names:
        return {}
    t0 = time.monotonic()
    log.info("evals start", step=step, evals=names, servers=len(servers))
    results = await runner.run(step=step, names=names, servers=servers)
    for r in results:
        write_eval_rows(run, r.name, step, r.rows)
        console.info(console_line(r))
    metrics = eval_metrics(results)
    log.info("evals done", step=step, seconds=round(time.monotonic() - t0, 2), **metrics)
    return metrics
