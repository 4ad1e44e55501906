"""``telescope ui [RUN_DIR_OR_RUNS_DIR ...]``: the web inspector (package telescope-ui) over runs.

It reads run directories in place (docs/records.md) and prints its URL; ``--open`` also opens a
browser. Listening beyond this machine (``--host``) needs a token, made and printed when not given.
"""

from __future__ import annotations

import argparse
import sys

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Serve the inspector over the run folders until Ctrl-C; 1 for a folder that is not one."""
    from telescope_ui import UiError, check_roots, serve

    roots = args.runs or ["runs"]
    try:
        check_roots(roots)
        serve(roots, host=args.host, port=args.port, token=args.token, open_browser=args.open)
    except UiError as err:
        print(f"telescope ui: {err}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
