"""A LoRA adapter on disk in PEFT's format: the one folder layout vLLM, PEFT and ``telescope convert`` share.

A folder holds ``adapter_config.json`` (PEFT's ``LoraConfig`` as JSON: ``r``, ``lora_alpha``,
``target_modules``, ...) and ``adapter_model.safetensors`` (the tensors under PEFT's names,
``base_model.model.<layer>.lora_A.weight`` and ``.lora_B.weight``). :func:`write_adapter` replaces
each file atomically (a reader never sees a file half written; the weights first, then the
config, which within a run never changes): the receiver rewrites the adapter a server loaded in
place after every update, and vLLM may read that folder again at any time.

``ADAPTER_NAME`` is the name a run's servers serve the adapter under (generation requests use it as
their ``model``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["ADAPTER_CONFIG", "ADAPTER_NAME", "ADAPTER_WEIGHTS", "write_adapter"]

ADAPTER_NAME = "telescope-adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def write_adapter(folder: str | Path, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write ``config`` and ``tensors`` into ``folder`` (created if needed), each file replaced atomically.

    The weights go first, the config last: a folder whose config is present holds weights of that
    config's shapes. Tensors are written contiguous and unshared (safetensors refuses views of one
    buffer, which is what a received bucket is).
    """
    from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType]

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if not tensors:
        raise ValueError("an adapter needs at least one tensor")
    owned = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    tmp = out / f".{ADAPTER_WEIGHTS}.{os.getpid()}"
    save_file(owned, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / ADAPTER_WEIGHTS)
    tmp = out / f".{ADAPTER_CONFIG}.{os.getpid()}"
    tmp.write_text(json.dumps(dict(config), indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out / ADAPTER_CONFIG)
    return out
