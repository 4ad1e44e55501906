"""A run's log file (logs/telescope.jsonl) holds JSON lines only: the libraries' stdlib log lines
(an agent's HTTP client, Ray) are JSON with the same keys, and the noisy ones are held at WARNING."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, sys
import structlog
from telescope_orchestrator.record.logging import configure_logging
with open(sys.argv[1], "w") as fh:
    configure_logging(file=fh)
    structlog.get_logger().info("step done", step=1)
    logging.getLogger("httpx2").info("HTTP Request: POST http://127.0.0.1/e/x/v1/chat/completions")
    logging.getLogger("some.library").warning("disk %s is slow", "/tmp")
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("some.library").exception("it broke")
"""


def test_every_line_of_the_log_file_is_json_with_the_same_keys(tmp_path):
    path = tmp_path / "telescope.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["event"] for x in lines] == [
        "step done",
        "disk /tmp is slow",
        "it broke",
    ]  # httpx2 INFO: held back
    assert [x["level"] for x in lines] == ["info", "warning", "error"]
    assert lines[1]["logger"] == "some.library"
    assert lines[1]["timestamp"].endswith("Z")
    assert "ZeroDivisionError" in lines[2]["exception"]
