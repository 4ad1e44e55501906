"""What each page asks of a run's record, answered by DuckDB over its Parquet files in place.

Every function takes a DuckDB cursor and a run directory and returns plain JSON-able data. The
format is docs/records.md; paths go into SQL only as bound parameters. Queries about one step
read that step's files alone (``records/<table>/step_NNNNNN*.parquet``), so they cost the same
at step 3 and at step 3,000; the timeline reads only the files whose time range (from their
Parquet statistics, cached by :class:`TimeIndex`) overlaps the window asked for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, Field

from telescope_ui._files import TimeIndex, step_files
from telescope_ui._metrics import training_lines

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = [
    "SampleFilter",
    "attempt_table",
    "eval_items",
    "eval_list",
    "group_list",
    "infra_series",
    "sample_detail",
    "sample_list",
    "step_list",
    "timeline",
]

SAMPLE_BRIEF = (
    "status, reason, env, group_id, sample_id, sample_index, reward, advantage, completion_tokens, "
    "num_turns, stop_reason, truncated, error, left(completion, 160) as preview"
)
MAX_BARS = 4000
"""Above this many generations in a window the timeline answers with busy lanes per time bucket."""


def rows(
    cursor: DuckDBPyConnection, sql: str, params: list[Any] | dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The result as a list of dicts, NaN and infinities as None (JSON has neither)."""
    result = cursor.execute(sql, params or [])
    names = [d[0] for d in result.description]
    return [{n: _clean(v) for n, v in zip(names, row, strict=True)} for row in result.fetchall()]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in cast("dict[object, object]", value).items()}
    if isinstance(value, list):
        return [_clean(v) for v in cast("list[object]", value)]
    return value


def step_list(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per training step from ``metrics.jsonl``: counts of groups and the mean reward."""
    keys = ("groups/kept", "groups/discarded", "groups/cancelled", "reward/mean", "derived/reward_mean")
    return [
        {"step": m["step"], "time": m.get("time"), **{k: m.get(k) for k in keys}}
        for m in training_lines(metrics)
    ]


class SampleFilter(BaseModel):
    """Which samples of a step a list shows: kept or not, one group, text in the prompt or the
    completion (case-insensitive), an environment, a tag (``name=value``), a reward range."""

    kept: bool | None = None
    group: int | None = None
    q: str | None = None
    env: str | None = None
    tag: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    limit: int = Field(500, ge=1, le=5000)

    def sql(self) -> tuple[str, list[Any]]:
        """The ``and ...`` conditions and their parameters, in order."""
        where: list[str] = []
        params: list[Any] = []
        if self.kept is not None:
            where.append("status = 'kept'" if self.kept else "status <> 'kept'")
        if self.group is not None:
            where.append("group_id = ?")
            params.append(self.group)
        if self.q:
            where.append("(contains(lower(completion), lower(?)) or contains(lower(prompt), lower(?)))")
            params += [self.q, self.q]
        if self.env:
            where.append("env = ?")
            params.append(self.env)
        if self.tag:
            key, _, value = self.tag.partition("=")
            where.append("tags[?] = ?")
            params += [key, value]
        for bound, op in ((self.min_reward, ">="), (self.max_reward, "<=")):
            if bound is not None:
                where.append(f"reward {op} ?")
                params.append(bound)
        return "".join(f" and {w}" for w in where), params


def group_list(cursor: DuckDBPyConnection, run: Path, step: int, *, kept: bool) -> list[dict[str, Any]]:
    """The groups of one step (kept, or discarded and cancelled), each with its reward at a glance."""
    files = step_files(run, "samples", step)
    if not files:
        return []
    status = "status = 'kept'" if kept else "status <> 'kept'"
    return rows(
        cursor,
        "select group_id, any_value(env) as env, any_value(sample_index) as sample_index, "
        "any_value(status) as status, any_value(reason) as reason, count(*) as samples, "
        "avg(reward) as reward_mean, min(reward) as reward_min, max(reward) as reward_max, "
        "max(abs(advantage)) as advantage_abs_max, left(any_value(prompt), 160) as prompt "
        f"from read_parquet(?, union_by_name = true) where {status} group by group_id order by group_id",
        [files],
    )


def sample_list(
    cursor: DuckDBPyConnection, run: Path, step: int, which: SampleFilter
) -> list[dict[str, Any]]:
    """Samples of one step that pass ``which``, by group and id."""
    files = step_files(run, "samples", step)
    if not files:
        return []
    extra, params = which.sql()
    return rows(
        cursor,
        f"select {SAMPLE_BRIEF} from read_parquet(?, union_by_name = true) where true{extra} "
        "order by group_id, sample_id limit ?",
        [files, *params, which.limit],
    )


def _tokens(
    cursor: DuckDBPyConnection, run: Path, step: int, sample_id: int, source: str, attempt: int
) -> list[dict[str, Any]]:
    """The sample's rows of the token table (one per training sequence; none for evals or a run
    that did not record them), each list column as a list, NaN as null."""
    paths = step_files(run, "tokens", step) if source == "train" else []
    if not paths:
        return []
    found = rows(
        cursor,
        "select * exclude (attempt, step) from read_parquet(?, union_by_name = true) "
        "where sample_id = ? and attempt = ? order by sequence",
        [paths, sample_id, attempt],
    )
    for row in found:
        for name, value in row.items():
            if isinstance(value, list):
                values = cast("list[Any]", value)
                row[name] = [None if isinstance(x, float) and math.isnan(x) else x for x in values]
    return found


def sample_detail(
    cursor: DuckDBPyConnection, run: Path, step: int, sample_id: int, *, source: str = "train"
) -> dict[str, Any] | None:
    """One sample whole: its row, turns, tool calls, lifecycle events and its environment's ranges.

    ``source`` is ``train`` or ``eval:<eval name>``; of the attempts that hold the id (ids restart
    on resume), the latest."""
    table = "samples" if source == "train" else "eval_samples"
    files = step_files(run, table, step)
    if not files:
        return None
    which = "" if source == "train" else " and eval = ?"
    found = rows(
        cursor,
        f"select * from read_parquet(?, union_by_name = true) where sample_id = ?{which} "
        "order by attempt desc limit 1",
        [files, sample_id] + ([source.removeprefix("eval:")] if which else []),
    )
    if not found:
        return None
    sample = found[0]
    sample["info"] = _json_or_text(sample.get("info"))

    def part(name: str, order: str, where: str = "true") -> list[dict[str, Any]]:
        paths = step_files(run, name, step)
        if not paths:
            return []
        return rows(
            cursor,
            f"select * exclude (attempt, step) from read_parquet(?, union_by_name = true) "
            f"where sample_id = ? and source = ? and attempt = ? and {where} order by {order}",
            [paths, sample_id, source, sample["attempt"]],
        )

    sample["turns"] = part("turns", "turn_index")
    sample["tool_calls"] = part("tool_calls", "call_index")
    sample["events"] = part("rollout_events", "started_at", HAPPENED)
    sample["tokens"] = _tokens(cursor, run, step, sample_id, source, sample["attempt"])
    sample["environment"] = _environment(cursor, run, sample.get("env"))
    return sample


def _json_or_text(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _environment(cursor: DuckDBPyConnection, run: Path, env: Any) -> dict[str, Any] | None:
    files = step_files(run, "environments", None)
    if not files or env is None:
        return None
    found = rows(
        cursor,
        "select * exclude (attempt) from read_parquet(?, union_by_name = true) where name = ? "
        "order by attempt desc limit 1",
        [files, env],
    )
    if not found:
        return None
    out = found[0]
    out["metrics_ranges"] = _json_or_text(out.get("metrics_ranges"))
    out["tags_options"] = _json_or_text(out.get("tags_options"))
    return out


def eval_list(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eval lines of ``metrics.jsonl`` by evaluated step (lines of one step merged, a later line
    winning, e.g. a ``telescope eval`` after training), in step order, with their ``eval/*`` metrics."""
    by_step: dict[int, dict[str, Any]] = {}
    for m in metrics:
        if isinstance(m.get("eval/step"), int):
            found = {k[5:]: v for k, v in m.items() if k.startswith("eval/") and k != "eval/step"}
            by_step.setdefault(m["eval/step"], {"step": m["eval/step"]}).update(found)
    return [by_step[s] for s in sorted(by_step)]


def eval_items(
    cursor: DuckDBPyConnection, run: Path, step: int, eval_name: str | None
) -> list[dict[str, Any]]:
    """The items of the evals at one step, each with its completions (the pass@k group)."""
    files = step_files(run, "eval_samples", step)
    if not files:
        return []
    where, params = ("where eval = ?", [eval_name]) if eval_name else ("", [])
    return rows(
        cursor,
        "select eval, sample_index, any_value(env) as env, any_value(prompt) as prompt, "
        "list({'sample_id': sample_id, 'completion_idx': completion_idx, 'completion': completion, "
        "'metrics': metrics, 'error': error, 'attempt': attempt} order by attempt, completion_idx) "
        f"as completions from read_parquet(?, union_by_name = true) {where} "
        "group by eval, sample_index order by eval, sample_index",
        [files, *params],
    )


HAPPENED = "started_at > 0"
"""Rows of ``rollout_events`` that happened: records of earlier versions hold a ``reward``
row at time 0.0 for every sample that was never scored (cancelled, or dropped at dispatch); they
are left out wherever times are read, so an old run's timeline still shows its own window."""

WIDE_FILES = 40
"""A timeline window over more step files than this is the overview: generations as busy buckets
and the trainer's top-level spans, both from facts cached per file, so a whole long run costs a
pass over a few numbers per file, not over every event."""
_SPANS = "rank, depth, name, started_at, ended_at, step, microbatch, minibatch, server"


def timeline(
    cursor: DuckDBPyConnection, run: Path, index: TimeIndex, start: float | None, end: float | None
) -> dict[str, Any]:
    """Generations per server and lane, trainer spans per rank and the driver's events in a window.

    Without a window: the run's whole span. Past :data:`MAX_BARS` generations the bars become
    ``busy`` buckets: per server and bucket (1/400 of the window), the generations in it; past
    :data:`WIDE_FILES` steps only the top-level spans (depth 0) are sent.
    """
    lo, hi = index.span(run)
    start = lo if start is None else start
    end = hi if end is None else end
    out: dict[str, Any] = {"run_start": lo, "run_end": hi, "start": start, "end": end}
    if start is None or end is None:
        return {**out, "servers": [], "bars": [], "busy": None, "spans": [], "events": []}
    events = index.files(run, "rollout_events", start, end)
    spans = index.files(run, "trainer_spans", start, end)
    if len(events) > WIDE_FILES:
        out.update(_busy_from_facts(cursor, index, events, start, end))
        out["spans"] = _cached_rows(
            cursor, index, spans, f"select {_SPANS}", "depth = 0", ("started_at", "ended_at"), start, end
        )
    else:
        out.update(_generations(cursor, events, start, end))
        out["spans"] = (
            rows(
                cursor,
                f"select {_SPANS} from read_parquet(?, union_by_name = true) "
                "where ended_at >= ? and started_at <= ? order by started_at limit 20000",
                [spans, start, end],
            )
            if spans
            else []
        )
    orch = index.files(run, "orchestrator_events", start, end)
    select = "select step, time, event, duration_s, detail, time + coalesce(duration_s, 0) as ended"
    found = _cached_rows(cursor, index, orch, select, "true", ("time", "ended"), start, end)
    out["events"] = [{k: v for k, v in e.items() if k != "ended"} for e in found[:5000]]
    return out


def _cached_rows(
    cursor: DuckDBPyConnection,
    index: TimeIndex,
    files: list[str],
    select: str,
    where: str,
    times: tuple[str, str],
    start: float,
    end: float,
) -> list[dict[str, Any]]:
    """Rows of small tables from a cache per file, those overlapping [start, end], in time order."""

    def compute(missing: list[str]) -> dict[str, list[dict[str, Any]]]:
        found = rows(
            cursor,
            f"{select}, filename from read_parquet(?, union_by_name = true, filename = true) where {where}",
            [missing],
        )
        by_file: dict[str, list[dict[str, Any]]] = {}
        for r in found:
            by_file.setdefault(r.pop("filename"), []).append(r)
        return by_file

    first, last = times
    picked = [
        r
        for per_file in index.facts(files, f"rows:{select}:{where}", compute).values()
        for r in per_file or []
        if r[last] >= start and r[first] <= end
    ]
    return sorted(picked, key=lambda r: r[first])


def _bucket(t: float, start: float, width: float) -> int:
    """The bucket (0..399) of time ``t`` in a window of 400 buckets from ``start``."""
    return min(399, max(0, int((t - start) // width)))


def _busy_from_facts(
    cursor: DuckDBPyConnection, index: TimeIndex, files: list[str], start: float, end: float
) -> dict[str, Any]:
    """Busy buckets from each file's generations per server (count, first start, last end), each
    file's count spread evenly over its time range."""

    def compute(missing: list[str]) -> dict[str, list[tuple[str, int, float, float]]]:
        found = rows(
            cursor,
            "select filename, server, count(*) as n, min(started_at) as lo, max(ended_at) as hi "
            "from read_parquet(?, union_by_name = true, filename = true) "
            f"where event = 'generation' and {HAPPENED} group by all",
            [missing],
        )
        by_file: dict[str, list[tuple[str, int, float, float]]] = {}
        for r in found:
            by_file.setdefault(r["filename"], []).append((r["server"], r["n"], r["lo"], r["hi"]))
        return by_file

    width = (end - start) / 400 or 1.0
    buckets: dict[tuple[str, int], float] = {}
    for facts in index.facts(files, "generations", compute).values():
        for server, n, lo, hi in facts or []:
            a, b = max(lo, start), min(hi, end)
            if b < a:
                continue
            for k in range(_bucket(a, start, width), _bucket(b, start, width) + 1):
                overlap = min(b, start + (k + 1) * width) - max(a, start + k * width)
                share = overlap / (hi - lo) if hi > lo else 1.0
                buckets[(server, k)] = buckets.get((server, k), 0.0) + n * share
    servers = sorted({s for s, _ in buckets}, key=str)
    busy = [{"server": s, "bucket": k, "n": v} for (s, k), v in sorted(buckets.items())]
    return {"servers": servers, "bars": [], "busy": {"width": width, "buckets": busy}}


def _generations(cursor: DuckDBPyConnection, files: list[str], start: float, end: float) -> dict[str, Any]:
    if not files:
        return {"servers": [], "bars": [], "busy": None}
    gen = (
        "select server, lane, started_at, ended_at, source, sample_id, step, attempt "
        "from read_parquet($files, union_by_name = true) "
        f"where event = 'generation' and {HAPPENED} and ended_at >= $start and started_at <= $end"
    )
    params = {"files": files, "start": start, "end": end}
    count = cursor.execute(f"select count(*) from ({gen})", params).fetchall()[0][0]
    servers = [r["server"] for r in rows(cursor, f"select distinct server from ({gen}) order by 1", params)]
    if count <= MAX_BARS:
        final = (
            "select source, sample_id, attempt, step, event as status "
            "from read_parquet($files, union_by_name = true) "
            "where event in ('kept', 'discarded', 'cancelled', 'evaluated')"
        )
        bars = rows(
            cursor,
            f"select g.*, coalesce(f.status, 'running') as status from ({gen}) g "
            f"left join ({final}) f using (source, sample_id, attempt, step) order by g.started_at",
            params,
        )
        return {"servers": servers, "bars": bars, "busy": None}
    width = (end - start) / 400 or 1.0
    busy = rows(
        cursor,
        "select server, least(399, cast(floor((greatest(started_at, $start) - $start) / $w) as int)) "
        "as bucket, "
        f"count(*) as n from ({gen}) group by all order by all",
        {**params, "w": width},
    )
    return {"servers": servers, "bars": [], "busy": {"width": width, "buckets": busy}}


def infra_series(
    cursor: DuckDBPyConnection,
    run: Path,
    index: TimeIndex,
    start: float | None,
    end: float | None,
    points: int = 600,
) -> list[dict[str, Any]]:
    """Every infra series (source, target, metric) in a window, averaged into at most ``points`` buckets."""
    ranges = index.ranges(run, "infra")
    if not ranges:
        return []
    start = min(r[1] for r in ranges) if start is None else start
    end = max(r[2] for r in ranges) if end is None else end
    files = index.files(run, "infra", start, end)
    if not files:
        return []
    width = max((end - start) / points, 1e-3)
    return rows(
        cursor,
        "select node, source, target, metric, list(t order by t) as t, list(v order by t) as v from ("
        f" select {_node_label(cursor, files)} as node, source, target, metric, avg(value) as v,"
        " $start + (floor((time - $start) / $w) + 0.5) * $w as t"
        " from read_parquet($files, union_by_name = true) where time between $start and $end group by all"
        ") group by all order by all",
        {"files": files, "start": start, "end": end, "w": width},
    )


def _node_label(cursor: DuckDBPyConnection, files: list[str]) -> str:
    """The SQL of an infra row's node: the host, with the start of its Ray node id where the record
    has one (several Ray nodes may share a host; infra version 1 has no ``node_id``)."""
    described = cursor.execute("describe select * from read_parquet(?, union_by_name = true)", [files])
    if "node_id" not in {str(r[0]) for r in described.fetchall()}:
        return "node"
    return "case when coalesce(node_id, '') = '' then node else node || ' · ' || left(node_id, 8) end"


def attempt_table(cursor: DuckDBPyConnection, run: Path, table: str) -> list[dict[str, Any]]:
    """Every row of a table written once per attempt (setup, model, environments)."""
    files = step_files(run, table, None)
    if not files:
        return []
    return rows(cursor, "select * from read_parquet(?, union_by_name = true) order by attempt", [files])
