"""The inspector's JSON API over a synthetic run, checked against the Parquet files read directly."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from telescope_ui import _queries, create_app
from telescope_ui.testing import synthetic_run

LOCAL = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    synthetic_run(root / "demo", steps=3, samples=16, group_size=4, turns=2)
    synthetic_run(root / "other", steps=2, samples=8, group_size=4, finished=False)
    (root / "other" / "config.yaml").write_text(
        (root / "demo" / "config.yaml").read_text().replace("3.0e-05", "1.0e-06")
    )
    return root


@pytest.fixture(scope="module")
def client(runs: Path) -> Iterator[TestClient]:
    with TestClient(create_app([runs]), base_url=LOCAL) as c:
        yield c


def get(client: TestClient, path: str, **params: Any) -> Any:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _table(runs: Path, table: str, step: int, run: str = "demo") -> list[dict[str, Any]]:
    return pq.read_table(runs / run / "records" / table / f"step_{step:06d}.parquet").to_pylist()


def test_runs_page_lists_status_progress_and_config_facts(client: TestClient) -> None:
    runs = {r["name"]: r for r in get(client, "/api/runs")}
    assert runs["demo"]["status"] == "finished"
    assert (runs["demo"]["step"], runs["demo"]["total_steps"]) == (3, 3)
    assert runs["demo"]["environments"] == ["countdown", "wordle"]
    assert runs["other"]["status"] == "running"  # no stop event, files just written
    assert runs["other"]["eta_s"] == pytest.approx(10.0)  # one step left at 10 s a step


def test_overview_and_config_diff(client: TestClient) -> None:
    o = get(client, "/api/overview", run="demo")
    assert o["user_keys"] == ["model", "learning_rate", "number_of_steps", "environments"]
    assert {e["name"] for e in o["environment_rows"]} == {"countdown", "wordle"}
    assert o["manifest"]["attempts"][0]["attempt"] == 0
    assert get(client, "/api/diff", a="demo", b="other") == [{"key": "learning_rate", "a": 3e-5, "b": 1e-6}]


def test_groups_of_a_step_match_the_samples_file(client: TestClient, runs: Path) -> None:
    rows = _table(runs, "samples", 2)
    kept = get(client, "/api/groups", run="demo", step=2)
    dropped = get(client, "/api/groups", run="demo", step=2, kept="false")
    # 16 samples in groups of 4: the synthetic run discards every fourth group
    assert [g["group_id"] for g in dropped] == sorted({r["group_id"] for r in rows if r["status"] != "kept"})
    assert len(kept) == 3
    assert len(dropped) == 1
    assert dropped[0]["reason"] == "zero_advantage"
    for g in kept:
        rewards = [r["reward"] for r in rows if r["group_id"] == g["group_id"]]
        assert g["reward_mean"] == pytest.approx(sum(rewards) / 4)
        assert (g["reward_min"], g["reward_max"]) == (min(rewards), max(rewards))


def test_sample_filters(client: TestClient, runs: Path) -> None:
    rows = _table(runs, "samples", 1)
    found = get(client, "/api/samples", run="demo", step=1, q="ANSWER IS 1", env="countdown")
    want = [
        r["sample_id"] for r in rows if "answer is 1" in r["completion"].lower() and r["env"] == "countdown"
    ]
    assert want
    assert [s["sample_id"] for s in found] == sorted(want)
    hard = get(
        client, "/api/samples", run="demo", step=1, tag="difficulty=hard", min_reward=0.2, max_reward=0.9
    )
    want = [
        r["sample_id"] for r in rows if dict(r["tags"])["difficulty"] == "hard" and 0.2 <= r["reward"] <= 0.9
    ]
    assert sorted(s["sample_id"] for s in hard) == sorted(want)
    assert get(client, "/api/samples", run="demo", step=99) == []


def test_a_sample_whole(client: TestClient, runs: Path) -> None:
    row = next(r for r in _table(runs, "samples", 3) if r["status"] == "kept")
    s = get(client, "/api/sample", run="demo", step=3, id=row["sample_id"])
    assert (s["reward"], s["completion"], s["golden_answers"]) == (
        row["reward"],
        row["completion"],
        {"correct": row["golden_answers"][0][1]},
    )
    assert [(t["turn_index"], t["role"]) for t in s["turns"]] == [(0, "model"), (1, "env"), (2, "model")]
    assert [(c["name"], c["turn_index"]) for c in s["tool_calls"]] == [("echo", 0)]
    assert [e["event"] for e in s["events"]] == [
        "dispatched",
        "generation",
        "tool_execution",
        "generation",
        "reward",
        "kept",
    ]
    assert s["environment"]["metrics_ranges"] == {"correct": {"min": 0.0, "max": 1.0, "invert": False}}
    (tokens,) = s["tokens"]  # one training sequence, as written (NaN would come back as null)
    (written,) = [r for r in _table(runs, "tokens", 3) if r["sample_id"] == row["sample_id"]]
    assert tokens["token_text"] == written["token_text"] == [w + " " for w in row["completion"].split(" ")]
    assert tokens["trainer_logprob"] == pytest.approx(written["trainer_logprob"])
    assert tokens["version_end"] == [2] * len(tokens["token_ids"])
    discarded = next(r for r in _table(runs, "samples", 3) if r["status"] == "discarded")
    assert get(client, "/api/sample", run="demo", step=3, id=discarded["sample_id"])["tokens"] == []
    missing = client.get("/api/sample", params={"run": "demo", "step": 3, "id": 10**9})
    assert missing.status_code == 404
    assert "no sample" in missing.json()["detail"]


def test_timeline_window_and_buckets(client: TestClient, runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = get(client, "/api/timeline", run="demo")
    generations = [
        e for step in (1, 2, 3) for e in _table(runs, "rollout_events", step) if e["event"] == "generation"
    ]
    assert len(whole["bars"]) == len(generations)
    assert sorted(whole["servers"]) == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert {b["status"] for b in whole["bars"]} == {"kept", "discarded"}
    assert {(s["rank"], s["depth"]) for s in whole["spans"]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert {e["event"] for e in whole["events"]} >= {"train_step", "weights_published", "stop"}
    # a window over the second step only: its generations, from its file alone
    step2 = [g for g in generations if g["step"] == 2]
    lo, hi = min(g["started_at"] for g in step2), max(g["ended_at"] for g in step2)
    part = get(client, "/api/timeline", run="demo", start=lo, end=hi)
    assert {b["step"] for b in part["bars"]} == {2}
    assert len(part["bars"]) == len(step2)
    monkeypatch.setattr(_queries, "MAX_BARS", 10)
    busy = get(client, "/api/timeline", run="demo")
    assert busy["bars"] == []
    assert sum(b["n"] for b in busy["busy"]["buckets"]) == len(generations)


def test_an_old_records_never_happened_rows_at_time_zero_do_not_stretch_the_timeline(tmp_path: Path) -> None:
    # records of earlier versions held a `reward` row at 0.0 for every sample never scored
    run = tmp_path / "runs" / "old"
    synthetic_run(run, steps=2, samples=8, group_size=4)
    path = run / "records" / "rollout_events" / "step_000002.parquet"
    table = pq.read_table(path)
    real = table.to_pylist()
    sid = real[0]["sample_id"]
    never = {"event": "reward", "started_at": 0.0, "ended_at": 0.0}
    zero = [{**r, **never} for r in real if r["event"] == "reward"]
    pq.write_table(pa.Table.from_pylist(real + zero, schema=table.schema), path)
    every = [e for s in (1, 2) for e in _table(tmp_path / "runs", "rollout_events", s, run="old")]
    lo = min(e["started_at"] for e in every if e["started_at"] > 0)
    hi = max(e["ended_at"] for e in every)
    with TestClient(create_app([tmp_path / "runs"]), base_url=LOCAL) as c:
        whole = get(c, "/api/timeline", run="old")
        sample = get(c, "/api/sample", run="old", step=2, id=sid)
    assert lo > 1e9  # a real time, not the epoch
    assert whole["run_start"] >= lo
    assert whole["start"] >= lo
    assert whole["end"] >= hi
    assert len(whole["bars"]) == sum(1 for e in every if e["event"] == "generation")
    assert all(e["started_at"] > 0 for e in sample["events"])
    assert [e["event"] for e in sample["events"]].count("reward") == 1


def test_the_timeline_ends_where_the_run_last_did_something(tmp_path: Path) -> None:
    # a long event early and a short one last: the window ends at the short one's end, not at
    # the last event's time plus the longest duration
    run = tmp_path / "runs" / "late"
    synthetic_run(run, steps=2, samples=8, group_size=4)
    path = run / "records" / "orchestrator_events" / "step_000002.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["duration_s"] = 3600.0  # a step's early event that lasted an hour (as a long eval)
    rows[-1]["duration_s"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    ends = [r["time"] + (r["duration_s"] or 0.0) for r in rows]
    for t in ("rollout_events", "trainer_spans"):
        ends += [e["ended_at"] for s in (1, 2) for e in _table(tmp_path / "runs", t, s, run="late")]
    with TestClient(create_app([tmp_path / "runs"]), base_url=LOCAL) as c:
        whole = get(c, "/api/timeline", run="late")
    assert whole["end"] == whole["run_end"] == pytest.approx(max(ends), abs=1e-6)
    assert whole["end"] < rows[-1]["time"] + 3600.0


def test_infra_setup_model_and_evals(client: TestClient, runs: Path) -> None:
    d = get(client, "/api/infra", run="demo")
    series = {(s["source"], s["metric"]): s for s in d["series"]}
    raw = pq.read_table(next((runs / "demo" / "records" / "infra").glob("*.parquet")))
    cpu = raw.filter(pc.field("metric") == "cpu_utilization_percent")
    got = series[("system", "cpu_utilization_percent")]
    assert len(got["t"]) == len(got["v"]) <= 600
    # the bucket means average to the mean of the samples when every bucket holds one sample
    assert sum(got["v"]) / len(got["v"]) == pytest.approx(statistics.fmean(cpu["value"].to_pylist()))
    assert d["setup"][0]["cpu_model"] == "Test CPU"
    assert d["model"][0]["parameters"] == 1234
    evals = get(client, "/api/evals", run="demo")
    assert evals == [{"step": 3, "digits/correct": 0.5, "digits/pass@2/correct": 1.0}]
    items = get(client, "/api/eval_items", run="demo", step=3)
    assert [len(i["completions"]) for i in items] == [2, 2, 2]  # pass@2: two completions per item
    assert [c["completion_idx"] for c in items[0]["completions"]] == [0, 1]


def test_infra_of_two_ray_nodes_on_one_host_are_two_series(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    synthetic_run(root / "two", steps=2, samples=8, group_size=4)
    folder = root / "two" / "records" / "infra"
    first = pq.read_table(next(folder.glob("*.parquet"))).to_pylist()
    # the same host, another Ray node (infra version 2 names it); the first file has none
    other = [{**r, "node_id": "c0ffee1234567890", "value": r["value"] + 1} for r in first]
    pq.write_table(pa.Table.from_pylist(other), folder / "a000-node0-2-000001.parquet")
    with TestClient(create_app([root]), base_url=LOCAL) as c:
        series = get(c, "/api/infra", run="two")["series"]
    cpu = sorted(s["node"] for s in series if s["metric"] == "cpu_utilization_percent")
    assert cpu == ["node0", "node0 · c0ffee12"]


def test_metrics_since_a_line(client: TestClient) -> None:
    full = get(client, "/api/metrics", run="demo")
    assert full["count"] == 4  # three steps and one eval line
    assert full["columns"]["step"] == [1, 2, 3]
    tail = get(client, "/api/metrics", run="demo", since=2)
    assert tail["columns"]["step"] == [3]


def test_unknown_runs_and_paths_outside_the_runs(client: TestClient) -> None:
    unknown = client.get("/api/overview", params={"run": "../../etc"})
    assert unknown.status_code == 404
    assert "the runs are: demo, other" in unknown.json()["detail"]
    for path in (
        "/static/../_app.py",
        "/static/%2e%2e/_app.py",
        "/static/..%2f_app.py",
        "/static//etc/passwd",
        "/etc/passwd",
    ):
        response = client.get(path)
        assert response.status_code == 404, path
        assert "import" not in response.text
    assert client.get("/static/app.js").status_code == 200


def test_pages_carry_a_content_security_policy(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"


def test_a_token_guards_every_request(runs: Path) -> None:
    with TestClient(create_app([runs], token="s3cret"), base_url=LOCAL) as c:
        assert c.get("/").status_code == 401
        assert c.get("/api/runs").status_code == 401
        assert c.get("/api/runs", params={"token": "wrong"}).status_code == 401
        first = c.get("/", params={"token": "s3cret"})
        assert first.status_code == 200
        assert "telescope_token" in first.headers["set-cookie"]
        assert c.get("/api/runs").status_code == 200  # the cookie from the first visit
    with TestClient(create_app([runs], token="s3cret"), base_url=LOCAL) as c:
        assert c.get("/api/runs", headers={"X-Telescope-Token": "s3cret"}).status_code == 200


def test_the_overview_of_a_long_window_comes_from_facts_per_file(
    client: TestClient, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generations = [
        e for step in (1, 2, 3) for e in _table(runs, "rollout_events", step) if e["event"] == "generation"
    ]
    monkeypatch.setattr(_queries, "WIDE_FILES", 1)  # three steps count as a long run
    wide = get(client, "/api/timeline", run="demo")
    assert wide["bars"] == []
    # each file's count is spread over its time range, all of which lies in the whole-run window
    assert sum(b["n"] for b in wide["busy"]["buckets"]) == pytest.approx(len(generations))
    per_server = {}
    for b in wide["busy"]["buckets"]:
        per_server[b["server"]] = per_server.get(b["server"], 0) + b["n"]
    want = {}
    for g in generations:
        want[g["server"]] = want.get(g["server"], 0) + 1
    assert per_server == pytest.approx(want)
    assert {s["depth"] for s in wide["spans"]} == {0}  # the top-level spans only
    assert len(wide["spans"]) == 3 * 2  # a train_step per step and rank
    assert {e["event"] for e in wide["events"]} >= {"train_step", "weights_published", "stop"}
    # a step written after the first look shows up (facts are per file)
    lo = wide["run_end"] + 1
    step4 = [{**e, "step": 4, "started_at": e["started_at"] + lo, "ended_at": e["ended_at"] + lo}
             for e in _table(runs, "rollout_events", 3)]  # fmt: skip
    import pyarrow as pa

    table = pq.read_table(runs / "demo" / "records" / "rollout_events" / "step_000003.parquet")
    path = runs / "demo" / "records" / "rollout_events" / "step_000004.parquet"
    pq.write_table(pa.Table.from_pylist(step4, schema=table.schema), path)
    try:
        later = get(client, "/api/timeline", run="demo")
        total = sum(b["n"] for b in later["busy"]["buckets"])
        assert total == pytest.approx(len(generations) + sum(1 for e in step4 if e["event"] == "generation"))
    finally:
        path.unlink()


def test_notes_are_the_one_thing_written(client: TestClient, runs: Path) -> None:
    assert get(client, "/api/notes", run="other") == {"text": ""}
    # without the inspector's header (as a page of another site would send it): refused
    refused = client.put("/api/notes", params={"run": "other"}, content="hi")
    assert refused.status_code == 403
    assert not (runs / "other" / "notes.md").exists()
    saved = client.put(
        "/api/notes", params={"run": "other"}, content="lr too high?", headers={"X-Telescope-Notes": "1"}
    )
    assert saved.status_code == 200
    assert (runs / "other" / "notes.md").read_text() == "lr too high?"
    assert get(client, "/api/notes", run="other") == {"text": "lr too high?"}
    huge = client.put(
        "/api/notes", params={"run": "other"}, content="x" * 100_001, headers={"X-Telescope-Notes": "1"}
    )
    assert huge.status_code == 413
    assert "limited to 100,000 characters" in huge.json()["detail"]
    assert (runs / "other" / "notes.md").read_text() == "lr too high?"
    missing = client.put(
        "/api/notes", params={"run": "../x"}, content="x", headers={"X-Telescope-Notes": "1"}
    )
    assert missing.status_code == 404


def test_other_host_names_are_refused(runs: Path) -> None:
    # a page whose own name was pointed at 127.0.0.1 (DNS rebinding) sends its name as Host
    with TestClient(create_app([runs]), base_url="http://attacker.example:8765") as c:
        assert c.get("/api/runs").status_code == 400
    with TestClient(create_app([runs]), base_url="http://localhost:8765") as c:
        assert c.get("/api/runs").status_code == 200
    with TestClient(create_app([runs], token="t", hosts=("*",)), base_url="http://node7:8765") as c:
        assert c.get("/api/runs", params={"token": "t"}).status_code == 200


def test_windows_must_be_finite(client: TestClient) -> None:
    response = client.get("/api/timeline", params={"run": "demo", "start": "nan", "end": 5})
    assert response.status_code == 400
    assert "finite" in response.json()["detail"]


def test_eval_samples_by_source_and_eval_lines_by_step(client: TestClient, runs: Path) -> None:
    items = get(client, "/api/eval_items", run="demo", step=3)
    first = items[0]["completions"][0]
    s = get(client, "/api/sample", run="demo", step=3, id=first["sample_id"], source="eval:digits")
    assert (s["eval"], s["completion"]) == ("digits", first["completion"])
    assert (
        client.get(
            "/api/sample", params={"run": "demo", "step": 3, "id": first["sample_id"], "source": "eval:other"}
        ).status_code
        == 404
    )
    lines = [{"step": 5, "eval/step": 5, "eval/a": 1.0}, {"step": 2, "eval/step": 2, "eval/a": 0.5},
             {"step": 5, "eval/step": 5, "eval/b": 2.0, "eval/standalone": 1}]  # fmt: skip
    assert _queries.eval_list(lines) == [
        {"step": 2, "a": 0.5},
        {"step": 5, "a": 1.0, "b": 2.0, "standalone": 1},
    ]


def test_a_damaged_manifest_is_named_on_its_run_and_hides_no_other_run(tmp_path: Path) -> None:
    synthetic_run(tmp_path / "good", steps=1, samples=8, group_size=4)
    synthetic_run(tmp_path / "bad", steps=1, samples=8, group_size=4)
    (tmp_path / "bad" / "records" / "manifest.json").write_text('{"attempts": [')
    with TestClient(create_app([tmp_path]), base_url=LOCAL) as c:
        assert {r["name"] for r in get(c, "/api/runs")} == {"good", "bad"}
        bad = c.get("/api/overview", params={"run": "bad"})
        assert bad.status_code == 422
        assert "manifest.json cannot be read" in bad.json()["detail"]
        assert "records/ folder aside" in bad.json()["detail"]
        assert get(c, "/api/overview", run="good")["manifest"]["attempts"][0]["attempt"] == 0
