"""Save and restore the trainer's state with PyTorch DCP, in the folder the caller gives (collective).

Model and optimizer are saved sharded (each rank writes its shards, no gather), so a checkpoint can
be loaded at another world size. The LR scheduler and counters go to ``trainer_state.pt`` (rank 0)
and each rank's RNG to ``rng_state_rank_<r>.pt``; all of it, the scheduler's position included, is
restored on load. With a ``timeline`` each phase is a span: on save ``get_state_dict``,
``dcp_save``, ``rng_state``, ``trainer_state``, ``hf_meta`` (rank 0) and ``barrier``; on load
``get_state_dict``, ``dcp_load``, ``set_state_dict``, ``trainer_state`` and ``barrier``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from telescope_algos.backend import Timeline, rng_state, set_rng_state
from telescope_trainer_fsdp import _checkpoint as ck
from telescope_trainer_fsdp._distributed import collectives

__all__ = ["load_state", "save_state"]

# torch annotates their checkpoint_id with a bare os.PathLike: they are taken through Any
dcp_load: Callable[..., None] = cast(Any, state_dict_loader).load
dcp_save: Callable[..., object] = cast(Any, state_dict_saver).save


def save_state(
    directory: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: Mapping[str, Any],
    training_state: bool,
    write_hf_meta: Callable[[Path], None],
    timeline: Timeline | None = None,
) -> None:
    """Write the trainer's state into exactly ``directory`` (layout: ``_checkpoint``). Every rank calls it."""
    directory = Path(directory)
    rank = dist.get_rank()
    tl = timeline if timeline is not None else Timeline(enabled=False)
    if not directory.is_dir():  # every rank sees the same (shared) folder: all raise, none waits
        raise FileNotFoundError(f"checkpoint folder {directory} does not exist (the caller makes it, empty)")
    with tl.span("get_state_dict"):
        if training_state:
            model_sd, optim_sd = get_state_dict(model, [optimizer])
            state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
        else:
            state = {"model": get_model_state_dict(model)}
    with tl.span("dcp_save"):
        dcp_save(state, checkpoint_id=str(directory))
    if training_state:
        with tl.span("rng_state"):
            torch.save(rng_state(), directory / ck.rng_file(rank))
    if rank == 0:
        if training_state:
            with tl.span("trainer_state"):
                torch.save(dict(trainer_state), directory / ck.TRAINER_STATE_FILE)
        with tl.span("hf_meta"):
            write_hf_meta(directory / ck.HF_META_DIR)
    with tl.span("barrier"):
        collectives.barrier()


def load_state(
    directory: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights_only: bool = False,
    timeline: Timeline | None = None,
) -> dict[str, Any] | None:
    """Restore ``directory`` into ``model`` (and ``optimizer``, RNG unless weights-only). Every rank calls it.

    Returns the saved trainer state (scheduler, counters), or None when only the weights were loaded.
    """
    checkpoint = ck.check_folder(directory)
    has_training = (checkpoint / ck.TRAINER_STATE_FILE).is_file()
    if not has_training and not weights_only:
        raise ValueError(
            f"{checkpoint} holds weights only (saved with training_state=False): load it with "
            "weights_only=True, or resume from a checkpoint saved with its training state"
        )
    tl = timeline if timeline is not None else Timeline(enabled=False)
    full = has_training and not weights_only
    with tl.span("get_state_dict"):
        if full:
            model_sd, optim_sd = get_state_dict(model, [optimizer])
            state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
        else:
            state = {"model": get_model_state_dict(model)}
    with tl.span("dcp_load"):
        dcp_load(state, checkpoint_id=str(checkpoint))
    with tl.span("set_state_dict"):
        if full:
            set_state_dict(
                model, [optimizer], model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        else:
            set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
    trainer_state = None
    if full:
        with tl.span("trainer_state"):
            trainer_state = torch.load(checkpoint / ck.TRAINER_STATE_FILE, weights_only=False)
            rng_path = checkpoint / ck.rng_file(dist.get_rank())
            if rng_path.is_file():  # absent when loading at a larger world size than saved
                set_rng_state(torch.load(rng_path, weights_only=False))
    with tl.span("barrier"):
        collectives.barrier()
    return trainer_state
