"""The inspector's web server: a JSON API over the runs' records and the static single-page app.

Every API route takes run *names* (``?run=``), resolved by :class:`RunIndex` among the folders
the server was given, never a path, and reads only, except ``PUT /api/notes``, which replaces
the run's ``notes.md`` (it needs the header ``X-Telescope-Notes: 1``, which a page of another
site cannot send); the static files come from this package.
With a token (required when the server listens beyond this machine) every request must carry it:
``?token=`` once (it is then kept in a cookie), the cookie, or the ``X-Telescope-Token`` header.
Pages get a Content-Security-Policy that allows only this server's own scripts, and the app puts
model and tool output into the page as text, never as HTML.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import duckdb
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from telescope_records import RecordError, read_manifest
from telescope_ui import _queries as qry
from telescope_ui._files import TimeIndex
from telescope_ui._metrics import MetricsCache, discarded_by_reason, is_dict, metric_columns
from telescope_ui._runs import (
    RunIndex,
    config_diff,
    log_tail,
    progress,
    read_config,
    read_notes,
    status,
    write_notes,
)

__all__ = ["create_app"]

STATIC = Path(__file__).with_name("static")
TOKEN_COOKIE = "telescope_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


class _State:
    def __init__(self, roots: Sequence[str | Path]) -> None:
        self.index = RunIndex(roots)
        self.con = duckdb.connect(":memory:")
        self.times = TimeIndex()
        self.metrics = MetricsCache()

    def run(self, name: str) -> Path:
        found = self.index.get(name)
        if found is None:
            known = ", ".join(r.name for r in self.index.runs()) or "none"
            raise HTTPException(404, f"no run named {name!r}; the runs are: {known}")
        return found.path

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()


def _summary(state: _State, name: str, path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """A run's line on the runs page: status, progress, model and environments."""
    metrics = state.metrics.lines(path)
    config, _ = read_config(path)
    attempts = manifest.get("attempts") or [{"attempt": 0}]
    attempt = int(attempts[-1].get("attempt", 0))
    st = status(path, _stop_events(state, path), attempt)
    total = config.get("number_of_steps")
    environments: Any = config.get("environments") or []
    envs = [e.get("name") for e in environments if is_dict(e)]
    return {
        "name": name,
        **st,
        **progress(metrics, total if isinstance(total, int) else None, st["status"] == "running"),
        "model": config.get("model"),
        "environments": envs,
        "algorithm": config.get("algorithm"),
        "started": attempts[0].get("started") or next((m["time"] for m in metrics if m.get("time")), None),
        "updated": next((m["time"] for m in reversed(metrics) if m.get("time")), None),
    }


def _manifest(path: Path, *, strict: bool) -> dict[str, Any]:
    """The run's manifest; a damaged one is an HTTP 422 naming the fix (``strict``, one run's
    page) or no manifest (the runs list, where the other runs still show)."""
    try:
        return read_manifest(path)
    except RecordError as err:
        if strict:
            raise HTTPException(422, str(err)) from None
        return {}


def _stop_events(state: _State, path: Path) -> dict[int, dict[str, Any]]:
    """The ``stop`` event (its detail) of each attempt that recorded one."""
    import json

    files = [str(p) for p in sorted((path / "records" / "orchestrator_events").glob("*-end-a*.parquet"))]
    if not files:
        return {}
    found = qry.rows(
        state.cursor(),
        "select attempt, arg_max(detail, time) as detail from read_parquet(?, union_by_name = true) "
        "where event = 'stop' group by attempt",
        [files],
    )
    stops: dict[int, dict[str, Any]] = {}
    for row in found:
        try:
            detail = json.loads(row["detail"] or "{}")
        except ValueError:
            detail = {"reason": row["detail"]}
        stops[int(row["attempt"])] = detail if isinstance(detail, dict) else {"reason": str(detail)}
    return stops


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise HTTPException(400, "start and end must be finite times (unix seconds)")
    return value


def _token_guard(
    token: str,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = (
            request.query_params.get("token")
            or request.cookies.get(TOKEN_COOKIE)
            or request.headers.get("x-telescope-token")
        )
        if not given or not secrets.compare_digest(given, token):
            return JSONResponse(
                {"detail": "this inspector needs its token: open the URL it printed (…/?token=…)"}, 401
            )
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response

    return guard


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def create_app(
    roots: Sequence[str | Path], *, token: str | None = None, hosts: Sequence[str] = LOCAL_HOSTS
) -> FastAPI:
    """The inspector over ``roots`` (run directories or folders of runs).

    ``hosts``: the names the browser may call this server by (the ``Host`` header); any other is
    refused, so a web page cannot reach a local inspector by pointing its own name at 127.0.0.1
    (DNS rebinding). ``("*",)`` allows any (for a server off loopback, which needs ``token``).
    """
    app = FastAPI(title="Telescope UI", docs_url=None, redoc_url=None, openapi_url=None)
    state = _State(roots)

    @app.middleware("http")
    async def headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    if token:
        app.middleware("http")(_token_guard(token))
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    _run_routes(app, state)
    _notes_routes(app, state)
    _record_routes(app, state)
    return app


def _run_routes(app: FastAPI, state: _State) -> None:
    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return [_summary(state, r.name, r.path, _manifest(r.path, strict=False)) for r in state.index.runs()]

    @app.get("/api/overview")
    def overview(run: str) -> dict[str, Any]:
        path = state.run(run)
        config, user_keys = read_config(path)
        manifest = _manifest(path, strict=True)
        return {
            **_summary(state, run, path, manifest),
            "config": config,
            "user_keys": user_keys,
            "manifest": manifest,
            "environment_rows": qry.attempt_table(state.cursor(), path, "environments"),
        }

    @app.get("/api/diff")
    def diff(a: str, b: str) -> list[dict[str, Any]]:
        return config_diff(read_config(state.run(a))[0], read_config(state.run(b))[0])

    @app.get("/api/logs")
    def logs(
        run: str, level: str | None = None, lines: int = Query(200, ge=1, le=5000)
    ) -> list[dict[str, Any]]:
        return log_tail(state.run(run), lines=lines, level=level)

    @app.get("/api/metrics")
    def metrics(run: str, since: int = Query(0, ge=0)) -> dict[str, Any]:
        lines = state.metrics.lines(state.run(run))
        return {"count": len(lines), **metric_columns(lines[since:])}

    @app.get("/api/steps")
    def steps(run: str) -> list[dict[str, Any]]:
        return qry.step_list(state.metrics.lines(state.run(run)))

    @app.get("/api/discarded")
    def discarded(run: str) -> dict[str, Any]:
        return discarded_by_reason(state.metrics.lines(state.run(run)))

    @app.get("/api/evals")
    def evals(run: str) -> list[dict[str, Any]]:
        return qry.eval_list(state.metrics.lines(state.run(run)))


def _notes_routes(app: FastAPI, state: _State) -> None:
    @app.get("/api/notes")
    def notes(run: str) -> dict[str, str]:
        return {"text": read_notes(state.run(run))}

    @app.put("/api/notes")
    async def save_notes(run: str, request: Request) -> dict[str, str]:
        # A custom header no other site's page may send without CORS (which is off): no CSRF.
        if request.headers.get("x-telescope-notes") != "1":
            raise HTTPException(403, "notes are saved from the inspector's own pages")
        text = (await request.body()).decode("utf-8", errors="replace")
        try:
            write_notes(state.run(run), text)
        except ValueError as err:
            raise HTTPException(413, str(err)) from err
        return {"text": text}


class SamplesQuery(qry.SampleFilter):
    """``/api/samples``: a run's step and the filter (FastAPI reads a model only as the whole query)."""

    run: str
    step: int


def _record_routes(app: FastAPI, state: _State) -> None:
    @app.get("/api/groups")
    def groups(run: str, step: int, kept: bool = True) -> list[dict[str, Any]]:
        return qry.group_list(state.cursor(), state.run(run), step, kept=kept)

    @app.get("/api/samples")
    def samples(query: Annotated[SamplesQuery, Query()]) -> list[dict[str, Any]]:
        return qry.sample_list(state.cursor(), state.run(query.run), query.step, query)

    @app.get("/api/sample")
    def sample(run: str, step: int, id: int, source: str = "train") -> dict[str, Any]:
        found = qry.sample_detail(state.cursor(), state.run(run), step, id, source=source)
        if found is None:
            raise HTTPException(404, f"no sample {id} at step {step} of {run!r}")
        return found

    @app.get("/api/timeline")
    def timeline(run: str, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        return qry.timeline(state.cursor(), state.run(run), state.times, _finite(start), _finite(end))

    @app.get("/api/infra")
    def infra(run: str, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        path = state.run(run)
        cursor = state.cursor()
        return {
            "series": qry.infra_series(cursor, path, state.times, _finite(start), _finite(end)),
            "setup": qry.attempt_table(cursor, path, "setup"),
            "model": qry.attempt_table(cursor, path, "model"),
        }

    @app.get("/api/eval_items")
    def eval_items(run: str, step: int, eval: str | None = None) -> list[dict[str, Any]]:
        return qry.eval_items(state.cursor(), state.run(run), step, eval)
