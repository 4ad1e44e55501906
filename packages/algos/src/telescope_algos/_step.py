"""The backend-neutral pieces of one train step, shared by the FSDP and Megatron trainers.

- :func:`loss_options`: the config's values of every ``compute_loss`` keyword that is not data
  (one mapping, not a hand-kept list per backend; a keyword the config lacks is an error);
- :func:`needs_old_logprobs`: whether the step starts with a no-grad pass for π_old;
- :func:`minibatch_groups`: micro-batches dealt round-robin into ``number_of_minibatches``
  optimizer updates, and :func:`step_counts`, each group's loss tokens and samples over the ranks
  (the ``num_tokens`` / ``num_samples`` of ``compute_loss``);
- :func:`row_multiple`: the length every packed row must be a multiple of for a parallel layout,
  and :func:`pad_multiple`, what the loop pads rows to;
- :func:`rng_state` / :func:`set_rng_state`: Python, NumPy, torch (and CUDA) RNG capture and
  restore for checkpoints.

Config objects are read by attribute (a ``telescope_config.TelescopeConfig`` or anything with the
same field names); this package does not import telescope-config.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from telescope_algos._loss import compute_loss
from telescope_algos._packing import MicroBatch

__all__ = [
    "DATA_KEYWORDS",
    "StepCounts",
    "loss_options",
    "minibatch_groups",
    "needs_old_logprobs",
    "pad_multiple",
    "rng_state",
    "row_multiple",
    "set_rng_state",
    "step_counts",
]

DATA_KEYWORDS = frozenset(
    {
        "advantages",
        "loss_mask",
        "rollout_logprobs",
        "old_logprobs",
        "entropy",
        "position_ids",
        "segment_ids",
        "num_tokens",
        "num_samples",
        "max_len",
    }
)
"""``compute_loss`` keywords that are data of the step, not config fields."""

_RATIO_ALGORITHMS = ("cispo", "gspo", "sapo")


def loss_options(config: object) -> dict[str, Any]:
    """Every keyword-only parameter of ``compute_loss`` outside :data:`DATA_KEYWORDS`, from ``config``."""
    names = [
        p.name
        for p in inspect.signature(compute_loss).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in DATA_KEYWORDS
    ]
    missing = [n for n in names if not hasattr(config, n)]
    if missing:
        raise ValueError(
            f"the config lacks loss fields {missing}: telescope-config and telescope-algos disagree"
        )
    return {n: getattr(config, n) for n in names}


def needs_old_logprobs(config: Any) -> bool:
    """True when the step starts with a no-grad pass for π_old (``ppo_clip_ref_logprobs: batch``)."""
    wants_ratio = bool(config.use_ppo_clip) or config.algorithm in _RATIO_ALGORITHMS
    return config.ppo_clip_ref_logprobs == "batch" and wants_ratio


def minibatch_groups(count: int, number_of_minibatches: int) -> list[list[int]]:
    """Indices of ``count`` micro-batches dealt round-robin (``i mod n``) into at most n non-empty groups."""
    if number_of_minibatches < 1:
        raise ValueError(f"number_of_minibatches must be >= 1, got {number_of_minibatches}")
    groups = [list(range(g, count, number_of_minibatches)) for g in range(number_of_minibatches)]
    return [g for g in groups if g]


def row_multiple(*, context_parallel: int = 1, tensor_parallel: int = 1) -> int:
    """The length every packed row must be a multiple of for a parallel layout.

    Tensor parallelism (with sequence parallel) splits a row over ``tp`` ranks; context parallelism
    over ``cp`` ranks splits it into ``2·cp`` equal chunks (two per rank, zig-zag), each of which is
    split over TP again: ``tp`` for ``cp = 1``, else ``cp · lcm(2, tp)``.
    """
    if context_parallel < 1 or tensor_parallel < 1:
        raise ValueError(f"parallel sizes must be >= 1, got cp={context_parallel}, tp={tensor_parallel}")
    if context_parallel == 1:
        return tensor_parallel
    return context_parallel * math.lcm(2, tensor_parallel)


@dataclass(frozen=True)
class StepCounts:
    """Step-wide totals over all ranks, per minibatch group."""

    tokens: list[int]
    samples: list[int]


def step_counts(
    micro_batches: Sequence[MicroBatch],
    groups: list[list[int]],
    *,
    device: torch.device | str = "cpu",
    group: Any = None,
    copies: int = 1,
) -> StepCounts:
    """Loss tokens and samples per minibatch group, summed over the ranks of ``group`` (one all-gather).

    ``groups`` are :func:`minibatch_groups` of ``micro_batches``. Every rank of ``group`` (default:
    the whole world; Megatron passes its data-parallel group) must hold as many micro-batches (else a
    ValueError on every rank). ``copies``: consecutive ranks that hold the same micro-batches (the
    context-parallel ranks of an FSDP replica); they must agree, and count once. These totals are
    ``compute_loss``'s ``num_tokens`` and ``num_samples``, so each update is the group's exact mean.
    """
    local = [len(micro_batches)]
    local += [sum(micro_batches[i].num_tokens for i in g) for g in groups]
    local += [sum(micro_batches[i].num_samples for i in g) for g in groups]
    t = torch.tensor(local, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)
    table = torch.stack(parts).cpu()
    counts = table[:, 0].tolist()
    if len(set(counts)) != 1:
        raise ValueError(
            f"ranks hold different numbers of micro-batches {counts}; every rank must get "
            "pack_samples(..., num_ranks=dp_world_size)[dp_rank] of the same step"
        )
    for first in range(0, world, copies):
        peers = table[first : first + copies]
        if not bool((peers == peers[0]).all()):
            raise ValueError(
                f"the context-parallel ranks {first}..{first + copies - 1} hold different micro-batches; "
                "every rank of a replica must get pack_samples(..., num_ranks=dp_world_size)[dp_rank]"
            )
    n = len(groups)
    totals = (table.sum(dim=0) // copies).tolist()
    return StepCounts(tokens=totals[1 : 1 + n], samples=totals[1 + n : 1 + 2 * n])


def rng_state() -> dict[str, Any]:
    """The Python, NumPy, torch (and CUDA, when present) RNG states of this process."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA's only where CUDA is present)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def pad_multiple(pad_to_multiple_of: int, trainer_multiple: int) -> int:
    """The multiple the loop pads rows to: of the config's ``pad_to_multiple_of`` and the trainer's."""
    return math.lcm(int(pad_to_multiple_of), int(trainer_multiple))
