"""Logging for every process of a run, configured in one place.

Libraries only call ``structlog.get_logger()``; this module decides where lines go. Each process
calls :func:`configure_logging` once: the command line (a compact console renderer on stderr),
the driver of ``telescope train`` (JSON lines into the run's ``logs/telescope.jsonl``) and each
trainer rank (JSON lines into ``logs/trainer/rank_N.log``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

NOISY = ("ray", "vllm", "httpx", "httpx2", "openai", "urllib3", "filelock")
"""Libraries whose INFO lines would drown a run's log: WARNING and up only, in a log file."""


def log_tail(path: Path, chars: int = 3000, *, lines: int | None = None) -> str:
    """The end of a log file: its last ``chars`` characters, or of those its last ``lines`` lines
    (the file is never read whole); ``""`` when it cannot be read."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - chars, 0))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text if lines is None else "\n".join(text.splitlines()[-lines:])


class JsonLines(logging.Formatter):
    """A stdlib log record as one JSON line with structlog's keys (``event``, ``level``,
    ``timestamp``) and the library's ``logger``: a run's log file holds nothing else."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "event": record.getMessage(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat()
            .replace("+00:00", "Z"),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(*, debug: bool = False, file: TextIO | None = None) -> None:
    """Route structlog and stdlib logging: INFO and up (DEBUG with ``debug``).

    Without ``file``: a compact console renderer on stderr. With ``file``: JSON lines into it (and
    the noisy libraries' loggers at WARNING).
    """
    import structlog

    level = logging.DEBUG if debug else logging.INFO
    if file is None:
        logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        renderer: structlog.typing.Processor = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        stamp = "%H:%M:%S"
        # sys.stderr is looked up at each call, not bound once: it may be replaced later
        # (test capture, a redirect), and a bound closed stream would break every library log line
        factory: Callable[..., Any] = lambda *args: structlog.PrintLogger(file=sys.stderr)  # noqa: E731
    else:
        logging.basicConfig(level=level, stream=file, force=True)
        for handler in logging.getLogger().handlers:  # the libraries' lines are JSON lines too
            handler.setFormatter(JsonLines())
        for noisy in NOISY:
            logging.getLogger(noisy).setLevel(logging.WARNING)
        renderer, stamp = structlog.processors.JSONRenderer(default=str), "iso"
        factory = structlog.PrintLoggerFactory(file=file)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt=stamp),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
