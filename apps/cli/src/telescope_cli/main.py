"""Entry point of the ``telescope`` command: parse first, import heavy later.

Each sub-command lives in its own module under ``telescope_cli.commands`` and is imported only
when it runs. Every user mistake ends as a clear message and a non-zero exit code, never a
traceback; ``--debug`` shows the traceback of an unexpected internal error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from telescope_cli.__about__ import __version__
from telescope_cli._exit import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK


class _Subcommands(Protocol):
    """What ``add_subparsers`` returns (argparse's private ``_SubParsersAction``), as used here."""

    def add_parser(
        self, name: str, *, help: str | None = ..., allow_abbrev: bool = ...
    ) -> argparse.ArgumentParser: ...


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off) for flags that take an optional value."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="run YAML file layered over the packaged defaults",
    )
    p.set_defaults(takes_overrides=True)
    p.epilog = (
        "Any other --FIELD VALUE pair overrides that config field, e.g. --learning_rate 5e-7, "
        "--learning-rate=5e-7, --wandb_tags '[\"a\"]' or --ray_runtime_env.env_vars.X 1."
    )


def _add_config_command(sub: _Subcommands) -> None:
    """``telescope config show|validate|schema``."""
    cfg = sub.add_parser("config", help="show, validate or export the run configuration", allow_abbrev=False)
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION")
    show = cfg_sub.add_parser(
        "show", help="print the resolved config as YAML, user-set keys marked", allow_abbrev=False
    )
    _add_config_args(show)
    show.add_argument("--no-marks", action="store_true", help="do not mark the keys you set")
    validate = cfg_sub.add_parser(
        "validate", help="check a config; exit 0 when valid, 1 otherwise", allow_abbrev=False
    )
    _add_config_args(validate)
    cfg_sub.add_parser("schema", help="print the JSON Schema of run YAML files (for editors)")


def _add_convert_command(sub: _Subcommands) -> None:
    """``telescope convert CHECKPOINT OUTPUT [--merge]``."""
    convert = sub.add_parser(
        "convert", help="turn a checkpoint into a Hugging Face safetensors folder", allow_abbrev=False
    )
    convert.add_argument("checkpoint", help="a checkpoint folder (…/checkpoints/step_N)")
    convert.add_argument(
        "output",
        help="the folder to write (config, safetensors, tokenizer; a LoRA adapter's files without --merge)",
    )
    convert.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA checkpoint as a merged Hugging Face model (W + alpha/r B A) instead of the adapter "
        "alone in PEFT's format; a checkpoint of the full model always comes out as the model",
    )


def _add_eval_command(sub: _Subcommands) -> None:
    """``telescope eval CHECKPOINT ... [--config] [--run-dir] [FIELD overrides]``."""
    ev = sub.add_parser(
        "eval", help="evaluate checkpoints with the config's evals, into the run's record", allow_abbrev=False
    )
    ev.add_argument(
        "checkpoints", nargs="+", help="checkpoint folders (…/step_N), their folder, or HF folders"
    )
    ev.add_argument(
        "--config", default=None, help="run YAML (default: the config.yaml of the checkpoints' run)"
    )
    ev.add_argument("--run-dir", default=None, help="where the results go (default: the checkpoints' run)")
    ev.add_argument("--quiet", action="store_true", help="no phase lines")
    ev.set_defaults(takes_overrides=True)


def _add_ui_command(sub: _Subcommands) -> None:
    """``telescope ui [RUN_DIR_OR_RUNS_DIR ...] [--host] [--port] [--token] [--open]``."""
    ui = sub.add_parser(
        "ui",
        help="the web inspector over run directories (rollouts, metrics, timeline, ...)",
        allow_abbrev=False,
    )
    ui.add_argument("runs", nargs="*", help="run directories or folders of runs (default: ./runs)")
    ui.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    ui.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    ui.add_argument(
        "--token",
        default=None,
        help="the token every request must carry (made and printed for a --host beyond this machine)",
    )
    ui.add_argument("--open", action="store_true", help="open the inspector in a browser")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """The arguments of ``train`` and ``sft``."""
    _add_config_args(p)
    p.add_argument("--run-dir", metavar="DIR", help="run directory (default: runs/<wandb_run_name or time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or phase lines")
    p.add_argument(
        "--debug",
        dest="train_debug",
        nargs="?",
        const=True,
        default=None,
        type=parse_bool,
        metavar="BOOL",
        help="debug logs in the run's logs/telescope.jsonl, Ray workers' output on the console (with "
        "ray_log_to_driver), tracebacks of internal errors; the same as the config field debug: true "
        "and as `telescope --debug train`. --debug false turns a config's debug: true off",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full command tree (cheap: no heavy imports)."""
    parser = argparse.ArgumentParser(
        prog="telescope",
        description="Telescope: reinforcement-learning post-training for LLMs.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"telescope {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="debug logs; tracebacks of internal errors (see train --help)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_config_command(sub)

    train = sub.add_parser(
        "train",
        help="train a model (no --config: ./configs/run.yaml, else the CPU quickstart)",
        allow_abbrev=False,
    )
    _add_train_args(train)
    sft = sub.add_parser(
        "sft",
        help="supervised fine-tuning only: number_of_steps steps on sft_dataset, no inference server",
        allow_abbrev=False,
    )
    _add_train_args(sft)

    doctor = sub.add_parser(
        "doctor", help="what this machine can run; with --config, a memory estimate", allow_abbrev=False
    )
    _add_config_args(doctor)

    _add_convert_command(sub)

    _add_eval_command(sub)

    _add_ui_command(sub)

    envs = sub.add_parser("envs", help="the environments Telescope can train on", allow_abbrev=False)
    envs_sub = envs.add_subparsers(dest="envs_command", metavar="ACTION")
    envs_sub.add_parser("list", help="every registered environment, its kind and what it needs")
    return parser


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "config":
        from telescope_cli.commands import config as config_cmd

        if args.config_command is None:
            parser.parse_args(["config", "--help"])
        return config_cmd.run(args)
    if args.command in ("train", "sft", "doctor", "convert", "eval", "ui"):
        import importlib

        return importlib.import_module(f"telescope_cli.commands.{args.command}").run(args)
    if args.command == "envs":
        from telescope_cli.commands import envs as envs_cmd

        if args.envs_command is None:
            parser.parse_args(["envs", "--help"])
        return envs_cmd.run(args)
    parser.print_help()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``telescope`` command; returns the process exit code."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    args.overrides = extras
    if getattr(args, "train_debug", None) is not None:  # `train --debug [BOOL]` wins over `--debug train`
        args.debug = args.train_debug
    from telescope_orchestrator import configure_logging

    configure_logging(debug=args.debug)
    try:
        return _dispatch(args, parser)
    except KeyboardInterrupt:
        print("telescope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the last line of defence: no traceback for users
        if args.debug:
            raise
        print(
            f"telescope: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in Telescope. Run the same command with --debug for the traceback, "
            "and report it with that output.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def entry() -> None:
    """Console-script wrapper: exit with ``main``'s code."""
    sys.exit(main())
