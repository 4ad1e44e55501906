"""``telescope sft``: a run of supervised steps only, on ``sft_dataset``'s conversations.

Every one of the config's ``number_of_steps`` is supervised (``sft_steps`` is set to it): no vLLM
server, teacher or reference model starts, no environment is built and no eval runs. Checkpoints,
resume, the records and the metrics are those of ``telescope train`` (docs/algorithms.md#sft); a
later ``telescope train`` with more ``number_of_steps`` than ``sft_steps`` can resume the run and go
on with RL. A config that sets ``sft_steps`` below ``number_of_steps`` (supervised steps, then RL)
is refused here: that run is ``telescope train``'s. Exit codes are ``train``'s.
"""

from __future__ import annotations

import argparse
import sys

from telescope_cli._exit import EXIT_INVALID
from telescope_cli._presets import default_run_config
from telescope_cli.commands.train import debug_override, run_resolved

NO_DATASET = (
    "telescope sft: no sft_dataset to train on. Give one with --sft_dataset: a .jsonl, .json or "
    '.parquet file of conversations (one {"messages": [{"role": ..., "content": ...}, ...]} per '
    "row) or a Hugging Face dataset id (docs/algorithms.md#sft)."
)


def run(args: argparse.Namespace) -> int:
    """Resolve the config with every step supervised, then run it as ``train`` does."""
    from telescope_config import ConfigError, load_config

    config_path = args.config or default_run_config()
    overrides = [*debug_override(args), *args.overrides]
    try:
        resolved = load_config(config_path, overrides)
        cfg = resolved.config
        if cfg.sft_dataset is None:
            print(NO_DATASET, file=sys.stderr)
            return EXIT_INVALID
        if "sft_steps" in resolved.user_keys and 0 < cfg.sft_steps != cfg.number_of_steps:
            print(
                f"telescope sft: the config sets sft_steps: {cfg.sft_steps} of number_of_steps: "
                f"{cfg.number_of_steps}, supervised steps and then RL: run it with telescope train, or "
                f"set number_of_steps to {cfg.sft_steps} (telescope sft trains every step supervised).",
                file=sys.stderr,
            )
            return EXIT_INVALID
        resolved = load_config(config_path, [*overrides, f"--sft_steps={cfg.number_of_steps}"])
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    return run_resolved(args, resolved, command="sft")
