"""The FSDP-specific pieces of one train step: step-wide counts and the forward pass.

The backend-neutral pieces (loss options, the π_old decision, minibatch groups) are
``telescope_algos``' (``_step`` there), shared with the Megatron backend.

Normalisation: every optimizer update divides its loss by the loss-token count of *its whole
minibatch group*: every micro-batch of the group on every rank (one collective before the
micro-batch loop). Summing the micro-batch losses over ranks therefore gives the group's token
mean, whatever the packing, the split into micro-batches or the number of ranks; dummy micro-batches
(no loss tokens) change nothing. FSDP averages gradients over ranks, so each rank backpropagates
``loss · world_size`` (with context parallelism too: see ``_context_parallel``). (The original
averaged per-micro-batch means: spec §12 item 15.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from telescope_algos import MicroBatch, token_logprobs_and_entropy

__all__ = ["StepCounts", "forward_logprobs", "gather_step_counts"]


@dataclass(frozen=True)
class StepCounts:
    """Step-wide totals over all ranks, per minibatch group."""

    tokens: list[int]
    samples: list[int]


def gather_step_counts(
    micro_batches: Sequence[MicroBatch], groups: list[list[int]], *, device: torch.device, copies: int = 1
) -> StepCounts:
    """One all-gather: check every rank holds as many micro-batches, and total tokens/samples per group.

    ``copies``: consecutive ranks that hold the same micro-batches (the context-parallel ranks of a
    replica); they must agree, and count once.
    """
    local = [len(micro_batches)]
    local += [sum(micro_batches[i].num_tokens for i in g) for g in groups]
    local += [sum(micro_batches[i].num_samples for i in g) for g in groups]
    t = torch.tensor(local, dtype=torch.int64, device=device)
    world = dist.get_world_size()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
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


def forward_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    device: torch.device,
    temperature: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(logprobs, entropy)`` of a micro-batch, aligned with ``input_ids`` (algos layout).

    ``position_ids`` go in and no attention mask: the attention isolates packed samples (``_model``).
    """
    input_ids = mb.input_ids.to(device, non_blocking=True)
    position_ids = mb.position_ids.to(device, non_blocking=True)
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    return token_logprobs_and_entropy(logits, input_ids, temperature=temperature, chunk_size=chunk_size)
