"""telescope-algos: Telescope's RL math as small pure torch functions.

Advantages (``compute_advantages`` and one function per estimator), the policy loss of every
algorithm with its modifiers (``compute_loss(LossInputs, LossOptions)`` and one function per policy
term and modifier), chunked token log-probabilities and entropy, sequence packing into
micro-batches, LR schedules and output filters. What the trainer backends share beside the math
(the ``TrainerBackend`` protocol, train-step pieces, the step's timeline, the context-parallel
split and attention) is in ``telescope_algos.backend``. Depends on torch and numpy only; imports no
other telescope package. The formulas, in words and with their papers: docs/algorithms.md.

Every per-token tensor is ``[rows, seq]`` and aligned with ``input_ids``: the value at position t
describes token t, predicted from positions < t (see ``token_logprobs_and_entropy``).
"""

from telescope_algos import backend
from telescope_algos.__about__ import __version__
from telescope_algos._advantages import (
    ALGORITHMS,
    batch_normalised,
    center_advantages,
    compute_advantages,
    distill_advantages,
    dr_grpo_advantages,
    group_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_advantages,
)
from telescope_algos._filters import is_gibberish, is_overlong, is_repetitive, overlong_penalty
from telescope_algos._modifiers import KL_ESTIMATORS, dual_clip, kl_penalty, seq_is_mask, tis_weights
from telescope_algos._objective import (
    POLICY_TERMS,
    TOKEN_FIELDS,
    LossInputs,
    LossOptions,
    compute_loss,
    loss_tokens,
)
from telescope_algos._packing import (
    MicroBatch,
    TrainingSample,
    first_fit_decreasing,
    logprob_array,
    pack_samples,
    pad_micro_batch,
    sample_tokens,
)
from telescope_algos._policy_terms import (
    PolicyInputs,
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
    reinforce_policy_loss,
    sapo_policy_loss,
)
from telescope_algos._schedule import LR_SCHEDULES, lr_multiplier
from telescope_algos._tokens import (
    align_to_inputs,
    label_logprobs_and_entropy,
    next_token_labels,
    token_logprobs,
    token_logprobs_and_entropy,
)

# The package's one list of public names (the private modules keep none of their own), by topic.
__all__ = ["__version__"]
# advantages
__all__ += [
    "ALGORITHMS",
    "batch_normalised",
    "center_advantages",
    "compute_advantages",
    "distill_advantages",
    "dr_grpo_advantages",
    "group_advantages",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "whiten_advantages",
]
# loss: the objective and the policy term of every algorithm
__all__ += [
    "POLICY_TERMS",
    "TOKEN_FIELDS",
    "LossInputs",
    "LossOptions",
    "PolicyInputs",
    "cispo_policy_loss",
    "compute_loss",
    "gspo_policy_loss",
    "loss_tokens",
    "ppo_clip_policy_loss",
    "reinforce_policy_loss",
    "sapo_policy_loss",
]
# modifiers & filters
__all__ += [
    "KL_ESTIMATORS",
    "dual_clip",
    "is_gibberish",
    "is_overlong",
    "is_repetitive",
    "kl_penalty",
    "overlong_penalty",
    "seq_is_mask",
    "tis_weights",
]
# tokens
__all__ += [
    "align_to_inputs",
    "label_logprobs_and_entropy",
    "next_token_labels",
    "token_logprobs",
    "token_logprobs_and_entropy",
]
# packing and the sample layout
__all__ += [
    "MicroBatch",
    "TrainingSample",
    "first_fit_decreasing",
    "logprob_array",
    "pack_samples",
    "pad_micro_batch",
    "sample_tokens",
]
# LR schedules
__all__ += ["LR_SCHEDULES", "lr_multiplier"]
# what the trainer backends share beside the math
__all__ += ["backend"]
