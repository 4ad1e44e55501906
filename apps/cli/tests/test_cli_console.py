"""The console of ``telescope train``: plain lines on a pipe, the progress bar on a terminal."""

from __future__ import annotations

import io
import re

import pytest

from telescope_cli.console import Console


class Pipe(io.StringIO):
    """A stream that is not a terminal and counts its flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


class Terminal(Pipe):
    def isatty(self) -> bool:
        return True


def _metrics(step: int, **extra) -> dict:
    return {
        "step": step,
        "reward/mean": 0.125 * step,
        "throughput/tokens_per_s": 1234.4 * step,
        "timing/step_s": 12.34 + step,
        "async_level": step % 2,
        **extra,
    }


@pytest.fixture(autouse=True)
def _no_forced_terminal(monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)


def test_a_pipe_gets_one_plain_flushed_line_per_step():
    out = Pipe()
    console = Console(3, file=out)
    assert console.plain
    console.start_training(0)
    lines_before = out.getvalue()
    for step in (1, 2, 3):
        flushes = out.flushes
        console.step(_metrics(step))
        assert out.flushes > flushes  # the line is out before the next step starts
    console.close()
    assert lines_before == ""  # no bar, nothing printed for it
    assert out.getvalue().splitlines() == [
        "step 1/3  reward 0.125  1,234 tok/s  time 13.3 s  async 1",
        "step 2/3  reward 0.250  2,469 tok/s  time 14.3 s  async 0",
        "step 3/3  reward 0.375  3,703 tok/s  time 15.3 s  async 1",
    ]


def test_phase_and_info_lines_stay_plain_text_on_a_pipe(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # colours forced: still no escape codes into a pipe
    out = Pipe()
    console = Console(2, file=out)
    console.info(f"run directory: /runs/{'x' * 120}")  # no wrapping at 80 columns
    with console.phase("model"):
        pass
    console.start_training(1)
    console.step(_metrics(2))
    console.close()
    console.info("[green]finished[/green] 2 steps; records in /runs/x")
    text = out.getvalue()
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == f"run directory: /runs/{'x' * 120}"
    assert lines[1] == "• model ..."
    assert re.fullmatch(r"  done model \(\d+\.\d s\)", lines[2])
    assert lines[3] == "step 2/2  reward 0.250  2,469 tok/s  time 14.3 s  async 0"
    assert lines[4] == "finished 2 steps; records in /runs/x"
    assert len(lines) == 5


def test_missing_metrics_print_nan_rather_than_failing():
    out = Pipe()
    console = Console(5, file=out)
    console.step({"step": 4})
    assert out.getvalue() == "step 4/5  reward nan  nan tok/s  time nan s  async 0\n"


def test_quiet_prints_nothing():
    out = Pipe()
    console = Console(2, enabled=False, file=out)
    with console.phase("model"):
        pass
    console.info("hello")
    console.start_training(0)
    console.step(_metrics(1))
    console.close()
    assert out.getvalue() == ""


def test_stderr_that_is_not_a_terminal_gets_plain_lines(capsys):
    console = Console(1)  # the default stream: stderr, here pytest's capture (not a terminal)
    assert console.plain
    console.step(_metrics(1))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "step 1/1  reward 0.125  1,234 tok/s  time 13.3 s  async 1\n"


def test_a_terminal_keeps_the_progress_bar():
    out = Terminal()
    console = Console(3, file=out)
    assert not console.plain
    console.start_training(0)
    assert console._progress is not None
    console.step(_metrics(1))
    console.close()
    text = out.getvalue()
    assert "step 1/3  reward" not in text  # no plain line: the bar carries the numbers
    assert "1/3" in text
    assert "reward 0.125  1,234 tok/s  time 13.3 s  async 1" in text


def test_a_waiting_step_prints_its_full_reports_on_a_pipe():
    out = Pipe()
    console = Console(3, file=out)
    console.start_training(0)
    for waited, full in ((5, False), (10, True), (15, False), (40, True)):
        console.waiting(1, waited, "kept 0/2 groups, 1 in flight; no group finished yet", plain=full)
    assert out.getvalue().splitlines() == [
        "step 1/3  waiting 10 s: kept 0/2 groups, 1 in flight; no group finished yet",
        "step 1/3  waiting 40 s: kept 0/2 groups, 1 in flight; no group finished yet",
    ]


def test_a_waiting_step_shows_in_the_bar_on_a_terminal():
    out = Terminal()
    console = Console(3, file=out)
    console.start_training(0)
    console.waiting(1, 5, "kept 0/2 groups, dropped 3 (zero_advantage 3)", plain=False)
    console._progress.refresh()
    console.close()
    assert "waiting 5 s: kept 0/2 groups, dropped 3 (zero_advantage 3)" in out.getvalue()
