"""Logging for the whole process, configured once by the CLI.

Libraries only call ``structlog.get_logger()``; this module decides where lines go: a compact
console renderer on stderr, warnings and up unless ``--debug``.
"""

from __future__ import annotations

import logging
import sys


def configure_logging(*, debug: bool = False) -> None:
    """Route structlog and stdlib logging to stderr; INFO and up (DEBUG with ``debug``)."""
    import structlog

    level = logging.DEBUG if debug else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # sys.stderr is looked up at each call, not bound once: it may be replaced later
        # (test capture, a redirect), and a bound closed stream would break every library log line
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
