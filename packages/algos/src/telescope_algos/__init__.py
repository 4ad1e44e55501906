"""telescope-algos: Telescope's RL math as small pure torch functions.

Advantages (``compute_advantages`` and one function per estimator), the policy loss of every
algorithm with its modifiers (``compute_loss`` and one function per policy term and modifier),
chunked token log-probabilities and entropy, sequence packing into micro-batches, the
context-parallel split and attention both trainers share, and output filters. Depends on torch and
numpy only; imports no other telescope package.

Every per-token tensor is ``[rows, seq]`` and aligned with ``input_ids``: the value at position t
describes token t, predicted from positions < t (see ``token_logprobs_and_entropy``).
"""

from telescope_algos.__about__ import __version__
from telescope_algos._advantages import (
    ALGORITHMS,
    center_advantages,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_advantages,
)
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
from telescope_algos._filters import is_gibberish, is_overlong, is_repetitive, overlong_penalty
from telescope_algos._loss import compute_loss
from telescope_algos._losses import (
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
    reinforce_policy_loss,
    sapo_policy_loss,
)
from telescope_algos._modifiers import dual_clip, kl_penalty, seq_is_mask, tis_weights
from telescope_algos._packing import MicroBatch, Sample, first_fit_decreasing, pack_samples
from telescope_algos._schedule import LR_SCHEDULES, lr_multiplier
from telescope_algos._segments import Segments, find_segments, segment_ids_from_position_ids
from telescope_algos._step import (
    StepCounts,
    loss_options,
    minibatch_groups,
    needs_old_logprobs,
    pad_multiple,
    rng_state,
    row_multiple,
    set_rng_state,
    step_counts,
)
from telescope_algos._tokens import (
    align_to_inputs,
    label_logprobs_and_entropy,
    next_token_labels,
    token_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)
from telescope_algos._trainer import TrainerBackend

__all__ = [
    "ALGORITHMS",
    "LR_SCHEDULES",
    "MicroBatch",
    "Sample",
    "Segments",
    "StepCounts",
    "TrainerBackend",
    "__version__",
    "align_to_inputs",
    "center_advantages",
    "chunk_bounds",
    "cispo_policy_loss",
    "compute_advantages",
    "compute_loss",
    "cu_seqlens",
    "dr_grpo_advantages",
    "dual_clip",
    "find_segments",
    "first_fit_decreasing",
    "gather_order",
    "gather_partial",
    "gather_replicated",
    "grpo_advantages",
    "gspo_policy_loss",
    "is_gibberish",
    "is_overlong",
    "is_repetitive",
    "kl_penalty",
    "label_logprobs_and_entropy",
    "loss_options",
    "lr_multiplier",
    "minibatch_groups",
    "needs_old_logprobs",
    "next_token_labels",
    "overlong_penalty",
    "pack_samples",
    "packed_attention",
    "pad_multiple",
    "ppo_clip_policy_loss",
    "reinforce_policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rng_state",
    "row_multiple",
    "sapo_policy_loss",
    "segment_ids_from_position_ids",
    "seq_is_mask",
    "set_rng_state",
    "split_length",
    "step_counts",
    "tis_weights",
    "token_entropy",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "whiten_advantages",
    "zigzag_indices",
]
