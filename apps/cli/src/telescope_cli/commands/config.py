"""``telescope config {show,validate,schema}``: the resolved run configuration.

``show`` prints the resolved YAML with the keys the user set marked; ``validate`` exits 0 or 1;
``schema`` prints a JSON Schema that editors use to autocomplete run YAML files.
"""

from __future__ import annotations

import argparse
import json
import sys

from telescope_cli._exit import EXIT_INVALID, EXIT_OK
from telescope_cli._presets import default_run_config


def run(args: argparse.Namespace) -> int:
    """Run one ``telescope config`` action."""

    from telescope_config import ConfigError, json_schema, load_config

    if args.config_command == "schema":
        print(json.dumps(json_schema(), indent=2))
        return EXIT_OK
    config_path = args.config or default_run_config()
    try:
        resolved = load_config(config_path, args.overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    if args.config_command == "show":
        sys.stdout.write(resolved.to_yaml(mark_user_keys=not args.no_marks))
    else:
        print(f"{config_path}: valid ({len(resolved.user_keys)} keys set over the defaults)")
    return EXIT_OK
