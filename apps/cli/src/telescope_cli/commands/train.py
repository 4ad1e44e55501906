"""``telescope train``: resolve the config, then run the whole job (see ``telescope_cli._train``).

With no ``--config`` it runs ``./configs/run.yaml`` when present, else the packaged CPU
quickstart. Exit codes: 0 finished, 1 bad input (config, run directory, resume), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from telescope_cli._exit import EXIT_INVALID, EXIT_OK
from telescope_cli._presets import default_run_config


def run(args: argparse.Namespace) -> int:
    from telescope_config import ConfigError, load_config

    config_path = args.config or default_run_config()
    try:
        resolved = load_config(config_path, args.overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    from telescope_cli._rundir import RunDirError
    from telescope_cli._train import TrainError, train

    try:
        train(resolved, run_dir=args.run_dir, debug=args.debug, quiet=args.quiet)
    except (RunDirError, TrainError) as err:
        print(f"telescope train: {err}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
