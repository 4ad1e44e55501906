"""``telescope eval CHECKPOINT ...``: evaluate checkpoints into the run's record
(``telescope_orchestrator.evaluate``).

The config is ``--config``, else the ``config.yaml`` of the run the checkpoints belong to, else
the command's default config; flags after it override fields as in ``telescope train`` (e.g.
``--evals '[{"name": "math500"}]'``). Exit codes: 0 done, 1 bad input (checkpoints, config, run
directory), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Evaluate the checkpoints into their run's record; 0 done, 1 bad input, 130 interrupted."""
    from telescope_cli._presets import default_run_config
    from telescope_cli.console import Console
    from telescope_config import ConfigError
    from telescope_orchestrator import EvalError, ServerStartError, evaluate
    from telescope_records import RecordError

    console = Console(0, enabled=not args.quiet)
    try:
        evaluate(
            args.checkpoints,
            args.config,
            overrides=list(args.overrides),
            run_dir=args.run_dir,
            default_config=default_run_config(),
            reporter=console,
        )
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    except (EvalError, ServerStartError, RecordError) as err:
        print(f"telescope eval: {err}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
