"""Save and restore the trainer's state with PyTorch DCP (collective; layout in ``_checkpoint``).

Model and optimizer are saved sharded (each rank writes its shards, no gather), so a checkpoint can
be loaded at another world size. The LR scheduler and counters go to ``trainer_state.pt`` (rank 0)
and each rank's RNG to ``rng_state_rank_<r>.pt``; all of it is restored on load (the original lost
the scheduler: spec §7 BUG).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from telescope_trainer_fsdp import _checkpoint as ck

__all__ = ["load_state", "save_state"]


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _json_extra(extra_state: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra_state or {})
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"extra_state must be JSON-serialisable (dicts, lists, str, numbers, bool, None): {exc}"
        ) from exc
    return extra


def save_state(
    root: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: Mapping[str, Any],
    meta: Mapping[str, Any],
    extra_state: Mapping[str, Any] | None,
    training_state: bool,
    write_hf_meta: Callable[[Path], None],
) -> Path:
    """Write ``<root>/step_<step>`` atomically; returns its path. Every rank calls it."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    extra = _json_extra(extra_state)
    rank = dist.get_rank()
    root = Path(root)
    final = root / f"{ck.CHECKPOINT_PREFIX}{step}"
    tmp = root / f"{final.name}.tmp"
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by an interrupted save
        tmp.mkdir(parents=True)
    dist.barrier()
    if training_state:
        model_sd, optim_sd = get_state_dict(model, [optimizer])
        state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(tmp))
    if training_state:
        torch.save(_rng_state(), tmp / ck.rng_file(rank))
    if rank == 0:
        if training_state:
            torch.save(dict(trainer_state), tmp / ck.TRAINER_STATE_FILE)
        write_hf_meta(tmp / ck.HF_META_DIR)
    dist.barrier()
    if rank == 0:
        full_meta = {
            **meta,
            "step": step,
            "time": time.time(),
            "world_size": dist.get_world_size(),
            "training_state": training_state,
            "extra_state": extra,
        }
        (tmp / ck.META_FILE).write_text(json.dumps(full_meta, indent=2), encoding="utf-8")
        ck.commit(tmp, final)
    dist.barrier()
    return final


def load_state(
    checkpoint: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights_only: bool = False,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Restore a checkpoint into ``model`` (and ``optimizer``, RNG unless weights-only). Every rank calls it.

    Returns ``(meta, trainer_state)``; ``trainer_state`` is None for a weights-only checkpoint or load.
    """
    meta = ck.read_meta(checkpoint)
    has_training = bool(meta.get("training_state")) and not weights_only
    if has_training:
        model_sd, optim_sd = get_state_dict(model, [optimizer])
        state = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=str(checkpoint))
        set_state_dict(
            model, [optimizer], model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(checkpoint))
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
    trainer_state = None
    if has_training:
        trainer_state = torch.load(checkpoint / ck.TRAINER_STATE_FILE, weights_only=False)
        rng_path = checkpoint / ck.rng_file(dist.get_rank())
        if rng_path.is_file():  # absent when loading at a larger world size than saved
            _set_rng_state(torch.load(rng_path, weights_only=False))
    dist.barrier()
    return meta, trainer_state
