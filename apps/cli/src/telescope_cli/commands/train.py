"""``telescope train``: resolve the config, then run the whole job (``telescope_orchestrator``).

With no ``--config`` it runs ``./configs/run.yaml`` when present, else the packaged CPU
quickstart. Exit codes: 0 finished, 1 bad input (config, run directory, resume, a broken
torch stack), 130 interrupted.

Debug mode is one thing whichever way it is asked for: ``telescope train --debug``,
``telescope --debug train`` or the config field ``debug: true`` (``--debug false`` turns a
config's ``debug: true`` off). The flag becomes the config field (so ``config.yaml`` records it
and Ray forwards worker output when ``ray_log_to_driver``), and the resolved field decides the
rest: debug logs on the console and in ``logs/telescope.jsonl``, tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from telescope_cli._exit import EXIT_INVALID, EXIT_OK
from telescope_cli._presets import default_run_config

if TYPE_CHECKING:
    from telescope_config import ResolvedConfig


def debug_override(args: argparse.Namespace) -> list[str]:
    """``--debug=...`` for the config when a debug flag was given (train's own flag wins)."""
    flag = getattr(args, "train_debug", None)
    if flag is None and getattr(args, "debug", False):
        flag = True
    return [] if flag is None else [f"--debug={'true' if flag else 'false'}"]


def run(args: argparse.Namespace) -> int:
    """Resolve the config and run the job with the console; 0 finished, 1 bad input."""
    from telescope_config import ConfigError, load_config

    config_path = args.config or default_run_config()
    try:
        resolved = load_config(config_path, [*debug_override(args), *args.overrides])
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    return run_resolved(args, resolved)


def run_resolved(args: argparse.Namespace, resolved: ResolvedConfig, command: str = "train") -> int:
    """Run the job of a resolved config with the console (``train`` and ``sft``); 0 finished, 1 bad input."""
    from telescope_orchestrator import RunDirError, TrainError, configure_logging, train

    debug = bool(resolved.config.debug)
    if debug and not args.debug:  # debug: true in the config file
        configure_logging(debug=True)
    args.debug = debug  # main() shows the traceback of an internal error when this is set
    from telescope_cli.console import Console
    from telescope_records import RecordError

    console = Console(resolved.config.number_of_steps, enabled=not args.quiet)
    try:
        train(resolved, reporter=console, run_dir=args.run_dir, debug=debug)
    except (RunDirError, TrainError, RecordError) as err:
        print(f"telescope {command}: {err}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
