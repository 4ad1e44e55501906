"""Checkpoint layout of the Megatron backend: per-rank shards plus a ready Hugging Face folder.

```
step_N/
  meta.json            backend, step, base_model, vocab and padded vocab sizes, parallel layout
  extra_state.pt       the caller's extra_state (rank 0)
  hf/                  config, tokenizer and model.safetensors: loadable by transformers and vLLM
  shards/rank_R.pt     rank R's model shard, optimizer state (Adam moments, fp32 main params),
                       scheduler step and RNG states (torch, megatron's tracker, python, numpy)
```

Format choice: each rank saves and loads exactly its own state with ``torch.save``, which is
simple and exact but means **resuming needs the same TP/PP/EP/DP layout** (checked, with a
clear error). To change the layout, start a new run with ``model: step_N/hf`` (weights kept,
optimizer state restarted). Writes go to ``step_N_tmp`` and rank 0 renames after a barrier, so a
crash never leaves a half-written ``step_N``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "HF_META_FILES",
    "optimizer_state",
    "rng_state",
    "set_optimizer_state",
    "set_rng_state",
    "shard_path",
]

HF_META_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def shard_path(directory: Path, rank: int) -> Path:
    return directory / "shards" / f"rank_{rank:05d}.pt"


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _main_params(opt: Any) -> list[list[torch.Tensor]]:
    for attr in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
        groups = getattr(opt, attr, None)
        if groups:
            return groups
    return []


def optimizer_state(optimizer: Any) -> list[dict[str, Any]]:
    """Adam state and fp32 main parameters of every sub-optimizer (this rank's share)."""
    out = []
    for opt in _sub_optimizers(optimizer):
        inner = getattr(opt, "optimizer", None)
        out.append(
            {
                "inner": inner.state_dict() if inner is not None else None,
                "main_params": [[p.detach().clone() for p in g] for g in _main_params(opt)],
            }
        )
    return out


@torch.no_grad()
def set_optimizer_state(optimizer: Any, state: list[dict[str, Any]]) -> None:
    """Inverse of :func:`optimizer_state` for an optimizer built with the same layout."""
    subs = _sub_optimizers(optimizer)
    if len(subs) != len(state):
        raise ValueError(f"checkpoint has {len(state)} optimizers, the model {len(subs)}: layouts differ")
    for opt, saved in zip(subs, state, strict=True):
        if saved["inner"] is not None:
            opt.optimizer.load_state_dict(saved["inner"])
        for group, saved_group in zip(_main_params(opt), saved["main_params"], strict=True):
            for p, s in zip(group, saved_group, strict=True):
                p.copy_(s)


def rng_state() -> dict[str, Any]:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    (directory / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {directory} is not a Megatron checkpoint of this backend")
    return json.loads(path.read_text(encoding="utf-8"))


def copy_hf_meta(model_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in HF_META_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)


def finalize(tmp: Path, final: Path) -> Path:
    """Replace ``final`` by ``tmp`` (rank 0 only, after a barrier)."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final
