"""``telescope convert CHECKPOINT OUTPUT``: a checkpoint → a Hugging Face safetensors folder.

The backend that wrote the checkpoint (``meta.json``'s ``backend``) converts it, so FSDP and
Megatron checkpoints both come out as one folder that ``transformers`` and vLLM load.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

from telescope_cli._exit import EXIT_INVALID, EXIT_OK


def run(args: argparse.Namespace) -> int:
    ckpt = Path(args.checkpoint)
    meta_file = ckpt / "meta.json"
    if not meta_file.is_file():
        print(
            f"telescope convert: {ckpt} is not a checkpoint (no meta.json). Pass a step_N folder from the "
            "run's checkpoints directory.",
            file=sys.stderr,
        )
        return EXIT_INVALID
    backend = json.loads(meta_file.read_text(encoding="utf-8")).get("backend", "fsdp")
    found = {ep.name: ep for ep in entry_points(group="telescope.trainers")}
    if backend not in found:
        print(
            f"telescope convert: backend {backend!r} is not installed; installed: {sorted(found)}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    module = found[backend].load()
    out = module.convert_checkpoint(ckpt, Path(args.output))
    print(f"wrote {out}")
    return EXIT_OK
