"""The FSDP-specific piece of one train step: the forward pass.

The backend-neutral pieces (loss options, the π_old decision, minibatch groups, the step-wide
counts) are ``telescope_algos``' (``_step`` there), shared with the Megatron backend.

Normalisation: every optimizer update divides its loss by the loss-token count of *its whole
minibatch group*: every micro-batch of the group on every rank (``telescope_algos.backend.step_counts``,
one collective before the micro-batch loop). Summing the micro-batch losses over ranks therefore
gives the group's token mean, whatever the packing, the split into micro-batches or the number of
ranks; dummy micro-batches (no loss tokens) change nothing. FSDP averages gradients over ranks, so
each rank backpropagates ``loss · world_size`` (with context parallelism too: see
``_context_parallel``). Averaging per-micro-batch means instead would weigh a token by how the
step happened to be packed (docs/algorithms.md#normalisation).
"""

from __future__ import annotations

import torch

from telescope_algos import MicroBatch, token_logprobs_and_entropy

__all__ = ["forward_logprobs"]


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
