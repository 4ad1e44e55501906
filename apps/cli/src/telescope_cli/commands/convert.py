"""``telescope convert CHECKPOINT OUTPUT [--merge]``: a checkpoint → a Hugging Face safetensors folder.

The backend that wrote the checkpoint (``meta.json``'s ``backend``) converts it with its
``convert_checkpoint(directory, out_dir)``, so FSDP and Megatron checkpoints both come out as one
folder that ``transformers`` and vLLM load. A LoRA checkpoint (``meta.json`` has ``lora``) comes out
as the adapter alone in PEFT's format (``adapter_only=True``), or with ``--merge`` as the model with
the adapter merged in.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Convert the checkpoint; 0 done, 1 bad input (module docstring)."""
    from telescope_orchestrator.run.checkpoints import CheckpointError, read_meta

    ckpt = Path(args.checkpoint)
    try:
        meta = read_meta(ckpt)
        backend = meta.get("backend", "fsdp")
    except (CheckpointError, ValueError) as err:  # ValueError: a meta.json that is not JSON
        print(f"telescope convert: {err}", file=sys.stderr)
        return EXIT_INVALID
    found = {ep.name: ep for ep in entry_points(group="telescope.trainers")}
    if backend not in found:
        print(
            f"telescope convert: {ckpt} was written by the {backend!r} backend, which is not installed; "
            f"installed: {', '.join(sorted(found))}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    adapter = "lora" in meta and not args.merge
    options = {"adapter_only": True} if adapter else {}
    try:
        out = found[backend].load().convert_checkpoint(ckpt, Path(args.output), **options)
    except (FileNotFoundError, ValueError) as err:
        print(f"telescope convert: {err}", file=sys.stderr)
        return EXIT_INVALID
    if adapter:
        print(f"wrote the LoRA adapter (PEFT's format) to {out}; --merge writes the merged model instead")
    else:
        print(f"wrote {out}")
    return EXIT_OK
