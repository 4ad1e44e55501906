"""telescope-ui: a local web inspector over Telescope run directories.

``telescope ui [RUN_DIR_OR_RUNS_DIR ...]`` serves it; :func:`create_app` is the ASGI app for
embedding (any ASGI server), :func:`serve` runs it on uvicorn. It reads the run record
(docs/records.md) in place and depends on nothing of training (no torch, vLLM or trainers).
"""

from telescope_ui.__about__ import __version__
from telescope_ui._app import create_app
from telescope_ui._runs import RunIndex
from telescope_ui._serve import UiError, check_roots, serve

__all__ = [
    "__version__",
    # the app
    "create_app", "serve",
    # runs and errors
    "RunIndex", "UiError", "check_roots",
]  # fmt: skip
