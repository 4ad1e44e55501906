"""The inspector in a real browser (Debian's chromium through Playwright) over synthetic runs.

The same pages over a real ``telescope train`` run are checked in tests/test_e2e_ui.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from telescope_records import RecordWriter
from telescope_ui.testing import serve_in_thread, synthetic_run

pytestmark = pytest.mark.browser

EVIL = (
    "<think>secret plan</think>Final answer:\n\n```python\nprint(1)\n```\n\n"
    '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"><b>bold?</b>'
)
PAGES = ["overview", "metrics", "rollouts", "discarded", "timeline", "infra", "evals"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    synthetic_run(root / "demo", steps=3, samples=16, completion=EVIL)
    synthetic_run(root / "live", steps=2, finished=False)
    starting = root / "starting"  # a run in its first seconds: its config and manifest, nothing else
    starting.mkdir()
    (starting / "config.yaml").write_text("model: m  # set by you\n")
    RecordWriter(starting).close()
    return root


@pytest.fixture
def page(chromium: Any, runs: Path) -> Iterator[Any]:
    with serve_in_thread([runs]) as url:
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        page.errors = []
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.base = url
        yield page
        page.close()


def ready(page: Any, name: str) -> None:
    page.wait_for_function(f"() => document.body.dataset.ready === '{name}'", timeout=15_000)


def navigate(page: Any, click: Any, name: str) -> None:
    page.evaluate("delete document.body.dataset.ready")
    click()
    ready(page, name)


def test_every_page_from_a_click_path_to_a_sample(page: Any, runs: Path, tmp_path: Path) -> None:
    page.goto(page.base)
    ready(page, "runs")
    page.screenshot(path=str(tmp_path / "runs.png"))
    assert page.locator("text=finished").count() >= 1
    navigate(page, lambda: page.click("a:text-is('demo')"), "overview")
    page.screenshot(path=str(tmp_path / "overview.png"))
    for name in PAGES[1:]:
        navigate(page, lambda name=name: page.click(f"nav a:text-is('{name}')"), name)
        assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
        page.screenshot(path=str(tmp_path / f"{name}.png"))
    # rollouts: step 2 -> its first kept group -> its first sample; prompt and reward on screen
    navigate(page, lambda: page.click("nav a:text-is('rollouts')"), "rollouts")
    navigate(page, lambda: page.click("#steps-panel tr[data-key='2']"), "rollouts")
    rows = pq.read_table(runs / "demo" / "records" / "samples" / "step_000002.parquet").to_pylist()
    first_group = min(r["group_id"] for r in rows if r["status"] == "kept")
    navigate(
        page,
        lambda: page.click(f"#groups-panel tr[data-key='{first_group}']"),
        "rollouts",
    )
    sample = min((r for r in rows if r["group_id"] == first_group), key=lambda r: r["sample_id"])
    navigate(page, lambda: page.click(f"#groups-panel tr[data-key='{sample['sample_id']}']"), "rollouts")
    assert page.text_content("#sample-prompt") == sample["prompt"]
    assert sample["reward"] == 0.0  # a whole-number reward still reads as a real number
    assert "reward 0.0000" in page.text_content("#sample-reward")
    assert f"sample={sample['sample_id']}" in page.url  # a link to the sample can be shared
    page.screenshot(path=str(tmp_path / "sample.png"), full_page=True)
    # notes typed on the overview land in the run directory
    navigate(page, lambda: page.click("nav a:text-is('overview')"), "overview")
    page.fill("#notes", "step 2 looks fine")
    page.click("#save-notes")
    page.wait_for_function("() => document.getElementById('notes-state').textContent === 'saved'")
    assert (runs / "demo" / "notes.md").read_text() == "step 2 looks fine"
    assert page.errors == []


def test_model_output_is_text_and_the_render_toggles(page: Any, tmp_path: Path) -> None:
    page.goto(f"{page.base}#/r/demo/discarded?step=1&sample=16")  # sample 16 holds EVIL
    ready(page, "discarded")
    panel = page.locator("#sample-panel")
    # markdown: the code fence is a code block, the reasoning folded
    assert panel.locator("pre code").first.text_content() == "print(1)\n"
    assert panel.locator("details.reasoning").count() == 1
    assert panel.locator("details.reasoning").get_attribute("open") is None
    assert not panel.get_by_text("secret plan", exact=True).is_visible()
    assert page.is_checked("#fold-reasoning")
    page.uncheck("#fold-reasoning")
    assert panel.get_by_text("secret plan").first.is_visible()
    page.select_option("#render-mode", "raw")
    assert (
        panel.locator(".turn").get_by_text("<think>secret plan</think>Final answer:", exact=False).count()
        == 1
    )
    # HTML in model output stays text: no script ran, no element was made from it
    assert page.evaluate("window.__xss") is None
    assert panel.locator("img").count() == 0
    assert panel.locator("script").count() == 0
    assert panel.locator("b:text-is('bold?')").count() == 0
    assert "<script>window.__xss = 1</script>" in panel.text_content()
    # the sample is an agent's: its tool calls' arguments and results are text too, and its second
    # training sequence (a history the agent rewrote) is marked where it begins, with the reason
    assert panel.locator(".tool").first.text_content().count("<script>window.__xss = 1</script>") == 2
    assert panel.locator(".segment").all_text_contents() == ["training sequence 2 · history_rewritten@2"]
    assert "2 (history_rewritten@2)" in panel.text_content()
    page.screenshot(path=str(tmp_path / "raw.png"), full_page=True)
    page.select_option("#render-mode", "markdown")  # leave the stored choice as it was
    assert page.errors == []


def backgrounds(page: Any) -> list[str]:
    """The computed background colour of every token of the token view."""
    script = (
        "[...document.querySelectorAll('#token-view .tok')].map((t) => getComputedStyle(t).backgroundColor)"
    )
    return page.evaluate(script)


def opacity(colour: str) -> float:
    """The alpha of a computed ``rgb(...)`` / ``rgba(...)`` colour."""
    parts = colour[colour.index("(") + 1 : -1].split(",")
    return float(parts[3]) if len(parts) == 4 else 1.0


def test_a_samples_tokens_are_coloured_by_what_the_sampler_and_trainer_made_of_them(
    page: Any, runs: Path, tmp_path: Path
) -> None:
    rows = pq.read_table(runs / "demo" / "records" / "tokens" / "step_000002.parquet").to_pylist()
    row = rows[0]
    page.goto(f"{page.base}#/r/demo/rollouts?step=2&sample={row['sample_id']}")
    ready(page, "rollouts")
    view = page.locator("#token-view")
    view.scroll_into_view_if_needed()
    tokens = view.locator(".tok")
    assert tokens.count() == len(row["token_ids"])
    assert tokens.all_text_contents() == row["token_text"]
    # by default the mismatch |sampler − trainer|: the largest gap is the reddest token
    gaps = [abs(a - b) for a, b in zip(row["sampler_logprob"], row["trainer_logprob"], strict=True)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    alpha = [opacity(c) for c in backgrounds(page)]
    assert alpha[worst] == max(alpha) > 0  # (gaps of 1 nat and more are all fully red)
    assert f"largest |sampler − trainer| {max(gaps):.4f}" in view.locator(".token-summary").text_content()
    assert "trainer" in (tokens.nth(worst).get_attribute("title") or "")
    page.screenshot(path=str(tmp_path / "tokens-mismatch.png"), full_page=True)
    # coloured by clipping: the one clipped token stands out
    page.select_option("#token-colour", "clipped")
    clipped = backgrounds(page)
    assert [opacity(c) > 0 for c in clipped] == [x != 0 for x in row["clipped"]]
    page.screenshot(path=str(tmp_path / "tokens-clipped.png"), full_page=True)
    page.select_option("#token-colour", "sampler − trainer logprob")  # leave the stored choice as it was
    assert page.errors == []


def test_a_new_step_appears_on_the_metrics_page(page: Any, runs: Path) -> None:
    page.goto(f"{page.base}#/r/live/metrics")
    ready(page, "metrics")
    assert page.text_content("#metrics-last-step") == "last step 2"
    line = {"step": 3, "time": 1.0, "loss": 0.1, "reward/mean": 0.9, "timing/step_s": 10.0}
    with (runs / "live" / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(line) + "\n")
    # the page polls every 2 s: the step shows within a few seconds of its line
    page.wait_for_function(
        "() => document.getElementById('metrics-last-step').textContent === 'last step 3'", timeout=6_000
    )
    assert page.errors == []


def test_metrics_of_another_run_overlaid_and_one_environment(page: Any) -> None:
    page.goto(f"{page.base}#/r/demo/metrics")
    ready(page, "metrics")
    page.select_option("#metrics-overlay", ["live"])
    chart = page.locator(".chart:has(.title:text-is('loss'))")
    chart.locator(".u-legend").wait_for()
    assert {"demo", "live"} <= set(chart.locator(".u-legend .u-label").all_text_contents())
    page.select_option("#metrics-env", "countdown")
    page.wait_for_function(
        "() => [...document.querySelectorAll('details.metrics .chart .title')].map((t) => t.textContent)"
        ".join('|') === 'reward/countdown/mean'"
    )
    titles = page.locator("details.metrics .chart .title").all_text_contents()
    assert titles == ["reward/countdown/mean"]
    assert page.errors == []


def test_a_run_with_nothing_recorded_yet_and_a_search_with_odd_characters(page: Any) -> None:
    for name in PAGES:
        page.goto(f"{page.base}#/r/starting/{name}")
        ready(page, name)
        assert page.locator("#error").is_hidden(), (name, page.locator("#error").text_content())
        page.evaluate("delete document.body.dataset.ready")
        page.goto("about:blank")
    page.goto(f"{page.base}#/r/demo/rollouts?step=1")
    ready(page, "rollouts")
    page.fill("#steps-panel ~ * input, .toolbar input[placeholder='search text']", "a&b=50% #1")
    page.evaluate("delete document.body.dataset.ready")
    page.click("button:text-is('filter')")
    ready(page, "rollouts")
    assert page.input_value(".toolbar input[placeholder='search text']") == "a&b=50% #1"
    assert "0 samples match at step 1" in page.text_content("#groups-panel")
    assert page.errors == []
