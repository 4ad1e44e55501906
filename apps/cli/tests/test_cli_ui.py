"""``telescope ui`` as a user runs it: its URL, a clean stop, and bad input as one line."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from telescope_ui.testing import synthetic_run


def _ui(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "telescope_cli", "ui", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_the_default_runs_folder_is_served_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    synthetic_run(tmp_path / "runs" / "demo", steps=1)
    ui = _ui("--port", "0", cwd=tmp_path)  # no folder given: ./runs
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        assert "token" not in line  # loopback needs none
        with urllib.request.urlopen(url.group(0) + "api/runs", timeout=30) as response:
            assert b'"name":"demo"' in response.read()
    finally:
        ui.send_signal(signal.SIGINT)
        _, err = ui.communicate(timeout=30)
    assert ui.returncode == 130
    assert "Traceback" not in err


def test_bad_input_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "telescope_cli", "ui", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 1
    assert missing.stderr.startswith("telescope ui: ")
    assert "is not a directory" in missing.stderr
    assert "Traceback" not in missing.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        busy = subprocess.run(
            [sys.executable, "-m", "telescope_cli", "ui", str(tmp_path), "--port", port],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert busy.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    assert "pick another --port" in busy.stderr


def test_another_address_gets_a_token_in_the_url(tmp_path: Path) -> None:
    ui = _ui(str(tmp_path), "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        found = re.search(r"http://([^:/]+):(\d+)/\?token=(\S+)", line)
        assert found, line
        assert found.group(1) == socket.gethostname()
        base = f"http://127.0.0.1:{found.group(2)}/api/runs"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base, timeout=30)
        assert refused.value.code == 401
        refused.value.close()  # an HTTPError holds the response open
        with urllib.request.urlopen(f"{base}?token={found.group(3)}", timeout=30) as response:
            assert response.status == 200
    finally:
        ui.send_signal(signal.SIGINT)
        ui.communicate(timeout=30)
