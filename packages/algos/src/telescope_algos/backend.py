"""What a trainer backend shares with the other, beside the math: the ``TrainerBackend``
protocol, the pieces of a train step (loss options from a config, micro-batch losses, step counts,
LR schedules, seeds and RNG state), the step's timeline of spans, packed-row segments, and the
context-parallel split and attention.

The math itself (advantages, losses, modifiers, token helpers, packing) is at the package root;
``telescope_algos`` is what loss research imports, this module what a backend imports.
"""

from telescope_algos._context_parallel import (
    chunk_bounds,
    cu_seqlens,
    gather_order,
    gather_partial,
    gather_replicated,
    packed_attention,
    split_length,
    zigzag_indices,
)
from telescope_algos._protocol import TrainerBackend
from telescope_algos._segments import Segments, find_segments, segment_ids_from_position_ids
from telescope_algos._step import (
    FROZEN_MODELS,
    FROZEN_TEMPERATURE,
    FROZEN_TOKEN_FIELDS,
    OBJECTIVES,
    SFT_OPTIONS,
    StepCounts,
    StepLog,
    StepPlan,
    TokenTrace,
    check_micro_batches,
    frozen_models,
    loss_options,
    lr_schedule,
    micro_batch_loss,
    minibatch_groups,
    needs_old_logprobs,
    pad_multiple,
    rng_state,
    row_multiple,
    seed_everything,
    set_rng_state,
    step_counts,
    with_frozen_logprobs,
)
from telescope_algos._timeline import Span, Timeline, nesting_problems

__all__ = [
    # the protocol every backend implements
    "TrainerBackend",
    # a train step
    "OBJECTIVES",
    "SFT_OPTIONS",
    "StepCounts",
    "StepLog",
    "StepPlan",
    "TokenTrace",
    "check_micro_batches",
    "loss_options",
    "lr_schedule",
    "micro_batch_loss",
    "minibatch_groups",
    "needs_old_logprobs",
    "pad_multiple",
    "row_multiple",
    "step_counts",
    # frozen models (teacher, reference) in the trainer
    "FROZEN_MODELS",
    "FROZEN_TEMPERATURE",
    "FROZEN_TOKEN_FIELDS",
    "frozen_models",
    "with_frozen_logprobs",
    # seeds and RNG state
    "rng_state",
    "seed_everything",
    "set_rng_state",
    # the step's timeline
    "Span",
    "Timeline",
    "nesting_problems",
    # packed rows
    "Segments",
    "find_segments",
    "segment_ids_from_position_ids",
    # context parallel
    "chunk_bounds",
    "cu_seqlens",
    "gather_order",
    "gather_partial",
    "gather_replicated",
    "packed_attention",
    "split_length",
    "zigzag_indices",
]
