"""``telescope convert CHECKPOINT OUTPUT [--merge]``: a checkpoint → a Hugging Face safetensors folder.

The backend that wrote the checkpoint converts it (``telescope_orchestrator.convert_checkpoint``),
so FSDP and Megatron checkpoints both come out as one folder that ``transformers`` and vLLM load. A
LoRA checkpoint comes out as the adapter alone in PEFT's format, or with ``--merge`` as the model
with the adapter merged in.
"""

from __future__ import annotations

import argparse
import sys

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Convert the checkpoint; 0 done, 1 bad input (module docstring)."""
    from telescope_orchestrator import CheckpointError, convert_checkpoint

    try:
        done = convert_checkpoint(args.checkpoint, args.output, merge=args.merge)
    except CheckpointError as err:
        print(f"telescope convert: {err}", file=sys.stderr)
        return EXIT_INVALID
    if done.adapter_only:
        print(f"wrote the LoRA adapter (PEFT's format) to {done.path}; --merge writes the merged model")
    else:
        print(f"wrote {done.path}")
    return EXIT_OK
