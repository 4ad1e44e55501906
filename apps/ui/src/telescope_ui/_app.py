"""The inspector's web server: a JSON API over the runs' records and the static single-page app.

Every API route takes run *names* (``?run=``), resolved by :class:`RunIndex` among the folders
the server was given, never a path, and reads only; the static files come from this package.
With a token (required when the server listens beyond this machine) every request must carry it:
``?token=`` once (it is then kept in a cookie), the cookie, or the ``X-Telescope-Token`` header.
Pages get a Content-Security-Policy that allows only this server's own scripts, and the app puts
model and tool output into the page as text, never as HTML.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from telescope_ui import _queries as qry
from telescope_ui._files import TimeIndex
from telescope_ui._metrics import MetricsCache, discarded_by_reason, metric_columns
from telescope_ui._runs import RunIndex, config_diff, log_tail, progress, read_config, status

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

    def cursor(self) -> Any:
        return self.con.cursor()


def _summary(state: _State, name: str, path: Path) -> dict[str, Any]:
    """A run's line on the runs page: status, progress, model and environments."""
    metrics = state.metrics.lines(path)
    config, _ = read_config(path)
    stop, attempt = _stop_event(state, path)
    st = status(path, stop, attempt)
    total = config.get("number_of_steps")
    envs = [e.get("name") for e in config.get("environments") or [] if isinstance(e, dict)]
    return {
        "name": name,
        **st,
        **progress(metrics, total if isinstance(total, int) else None, st["status"] == "running"),
        "model": config.get("model"),
        "environments": envs,
        "algorithm": config.get("algorithm"),
        "started": _started(path) or next((m["time"] for m in metrics if m.get("time")), None),
        "updated": next((m["time"] for m in reversed(metrics) if m.get("time")), None),
    }


def _started(path: Path) -> float | None:
    from telescope_records import read_manifest

    attempts = read_manifest(path).get("attempts") or []
    return attempts[0].get("started") if attempts else None


def _stop_event(state: _State, path: Path) -> tuple[dict[str, Any] | None, int]:
    """The last attempt's ``stop`` event (its detail) and the last attempt's number."""
    import json

    from telescope_records import read_manifest

    attempts = read_manifest(path).get("attempts") or [{"attempt": 0}]
    attempt = int(attempts[-1].get("attempt", 0))
    files = [
        str(p)
        for p in sorted((path / "records" / "orchestrator_events").glob(f"*-end-a{attempt:03d}*.parquet"))
    ]
    if not files:
        return None, attempt
    found = qry.rows(
        state.cursor(),
        "select detail from read_parquet(?, union_by_name = true) where event = 'stop' and attempt = ? "
        "order by time desc limit 1",
        [files, attempt],
    )
    if not found:
        return None, attempt
    try:
        return json.loads(found[0]["detail"] or "{}"), attempt
    except ValueError:
        return {"reason": found[0]["detail"]}, attempt


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


def create_app(roots: Sequence[str | Path], *, token: str | None = None) -> FastAPI:
    """The inspector over ``roots`` (run directories or folders of runs)."""
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
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    _run_routes(app, state)
    _record_routes(app, state)
    return app


def _run_routes(app: FastAPI, state: _State) -> None:
    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return [_summary(state, r.name, r.path) for r in state.index.runs()]

    @app.get("/api/overview")
    def overview(run: str) -> dict[str, Any]:
        path = state.run(run)
        config, user_keys = read_config(path)
        from telescope_records import read_manifest

        return {
            **_summary(state, run, path),
            "config": config,
            "user_keys": user_keys,
            "manifest": read_manifest(path),
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


def _record_routes(app: FastAPI, state: _State) -> None:
    @app.get("/api/groups")
    def groups(run: str, step: int, kept: bool = True) -> list[dict[str, Any]]:
        return qry.group_list(state.cursor(), state.run(run), step, kept=kept)

    @app.get("/api/samples")
    def samples(
        run: str,
        step: int,
        kept: bool | None = None,
        group: int | None = None,
        q: str | None = None,
        env: str | None = None,
        tag: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        limit: int = Query(500, ge=1, le=5000),
    ) -> list[dict[str, Any]]:
        return qry.sample_list(
            state.cursor(), state.run(run), step, kept=kept, group=group, q=q, env=env, tag=tag,
            min_reward=min_reward, max_reward=max_reward, limit=limit,
        )  # fmt: skip

    @app.get("/api/sample")
    def sample(run: str, step: int, id: int, source: str = "train") -> dict[str, Any]:
        found = qry.sample_detail(state.cursor(), state.run(run), step, id, source=source)
        if found is None:
            raise HTTPException(404, f"no sample {id} at step {step} of {run!r}")
        return found

    @app.get("/api/timeline")
    def timeline(run: str, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        return qry.timeline(state.cursor(), state.run(run), state.times, start, end)

    @app.get("/api/infra")
    def infra(run: str, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        path = state.run(run)
        cursor = state.cursor()
        return {
            "series": qry.infra_series(cursor, path, state.times, start, end),
            "setup": qry.attempt_table(cursor, path, "setup"),
            "model": qry.attempt_table(cursor, path, "model"),
        }

    @app.get("/api/eval_items")
    def eval_items(run: str, step: int, eval: str | None = None) -> list[dict[str, Any]]:
        return qry.eval_items(state.cursor(), state.run(run), step, eval)
