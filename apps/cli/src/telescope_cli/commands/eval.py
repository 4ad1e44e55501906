"""``telescope eval CHECKPOINT ...``: evaluate checkpoints into the run's record
(``telescope_orchestrator.run.standalone_eval``).

The config is ``--config``, else the ``config.yaml`` of the run the checkpoints belong to; flags
after it override fields as in ``telescope train`` (e.g. ``--evals '[{"name": "math500"}]'``).
Exit codes: 0 done, 1 bad input (checkpoints, config, run directory), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Evaluate the checkpoints into their run's record; 0 done, 1 bad input, 130 interrupted."""
    from telescope_orchestrator.run.standalone_eval import EvalError, find_checkpoints, run_dir_of

    try:
        checkpoints = find_checkpoints(args.checkpoints)
        run_dir = run_dir_of(checkpoints, args.run_dir)
    except EvalError as err:
        print(f"telescope eval: {err}", file=sys.stderr)
        return EXIT_INVALID
    from telescope_config import ConfigError, load_config

    config = args.config or (str(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else None)
    if config is None:
        from telescope_cli._presets import default_run_config

        config = default_run_config()
    try:
        resolved = load_config(config, list(args.overrides))
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    from telescope_cli.console import Console
    from telescope_orchestrator.cluster.vllm_server import ServerStartError
    from telescope_orchestrator.record.rundir import RunDir
    from telescope_orchestrator.run.standalone_eval import standalone_eval
    from telescope_orchestrator.run.startup import sigterm_to_interrupt
    from telescope_records import RecordError

    sigterm_to_interrupt()  # SIGTERM stops the eval's vLLM server too
    console = Console(0, enabled=not args.quiet)
    console.info(f"{len(checkpoints)} checkpoint(s) -> {Path(run_dir)}")
    try:
        standalone_eval(resolved.config, checkpoints, RunDir(run_dir), console)
    except (EvalError, ServerStartError, RecordError) as err:
        print(f"telescope eval: {err}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
