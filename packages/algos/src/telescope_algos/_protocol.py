"""The backend-neutral trainer protocol: what the training loop needs from FSDP2 and Megatron.

A backend package exposes ``create_trainer(config, *, model_path, seed, **options) ->
TrainerBackend`` and ``convert_checkpoint(directory, out_dir) -> Path`` (a folder written by
``save_checkpoint`` → a Hugging Face safetensors folder, without torch.distributed), and registers
its module under the entry-point group ``telescope.trainers`` (name = the config's
``train_backend``). ``config`` is the run's ``telescope_config.TelescopeConfig``, validated once by
the caller and handed to every rank as is: a backend reads it, and never validates or rebuilds it.
Every method is *collective*: every rank of the trainer world calls it with the same arguments, in
the same order.

``create_trainer`` may also take ``frozen_models``, ``{name: local folder}`` of the frozen models the
ranks hold beside the policy (names in :data:`~telescope_algos.backend.FROZEN_MODELS`: the teacher of
on-policy distillation, the reference model of the reference KL; ``teacher_placement`` /
``ref_placement`` ``trainer``): before the loss of an RL step, each one's logprobs of every
micro-batch (raw distribution, temperature 1, no gradient) fill the micro-batch's ``teacher_logprobs``
/ ``ref_logprobs``, which the caller then leaves empty. A backend without it is given none.

``torch.distributed`` is initialised by the backend from the usual environment variables
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) when the caller has not done it:
gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from telescope_algos._packing import MicroBatch
from telescope_algos._timeline import Timeline


@runtime_checkable
class TrainerBackend(Protocol):
    """A training backend. Metrics are plain floats keyed ``name`` or ``section/group/name``."""

    rank: int
    world_size: int
    dp_rank: int
    """Which data shard this rank trains on (``pack_samples`` deals one list per DP rank)."""
    dp_world_size: int
    """How many data shards a step is split into."""
    row_multiple: int
    """Packed rows must be a multiple of this length (``row_multiple`` of the parallel layout); the
    caller pads to ``pad_multiple(config.pad_to_multiple_of, row_multiple)``."""
    shares_prompts: bool
    """True when the attention honours branches, so the caller may pack with
    ``pack_samples(..., share_prompts=True)`` (docs/algorithms.md#shared-prompts)."""
    timeline: Timeline
    """Spans of every step on this rank (``train_step`` and its phases, checkpoints, weight export;
    docs/algorithms.md#step-timeline); the caller drains it (``timeline.drain()``)."""

    @property
    def is_broadcast_rank(self) -> bool:
        """True on the one rank that sends weights to the inference servers."""
        ...

    def train_step(
        self, micro_batches: Sequence[MicroBatch], *, step: int, objective: str = "rl"
    ) -> dict[str, float]:
        """One optimizer step on this rank's micro-batches (from ``pack_samples(...)[dp_rank]``).

        ``objective`` (``OBJECTIVES``): ``rl``, the run's loss; ``sft``, a supervised step
        (``StepPlan``: the token-mean negative log-likelihood of the trained tokens, one update, no
        other logprobs). Returns the step metrics, identical on every rank: at least ``loss``,
        ``entropy``, ``grad_norm``, ``learning_rate``, ``num_tokens`` and ``timing/*`` entries, and
        ``kl_divergence_inference`` for ``rl``.
        """
        ...

    def step_tokens(self) -> list[dict[str, np.ndarray] | None]:
        """What the loss of the last ``train_step`` did with each token, for the run record's token table:
        one dict per micro-batch it was given, in order, of :data:`~telescope_algos.TOKEN_FIELDS` arrays
        (float32, aligned with the micro-batch's ``input_ids`` and as long), and of the
        :data:`~telescope_algos.backend.FROZEN_TOKEN_FIELDS` of the frozen models it holds; empty when
        the last step was supervised or the config's ``record_tokens`` is off. Local: not collective."""
        ...

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full model in Hugging Face names, a layer or bucket at a time (collective).

        Every rank must exhaust the iterator; tensors are complete (gathered) and may be freed
        by the backend as soon as the consumer moves on, so the whole model is never held at once.
        """
        ...

    def adapter_config(self) -> dict[str, Any] | None:
        """PEFT's ``adapter_config.json`` (as a dict) of the LoRA adapter this run trains on the frozen
        base model, or None when it trains the full model (``lora_rank`` 0)."""
        ...

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapter alone under PEFT's names (``base_model.model.<layer>.lora_A.weight``, ...),
        one gathered tensor at a time (collective, like :meth:`hf_weights`); only when
        :meth:`adapter_config` is not None (otherwise ``ValueError``)."""
        ...

    def save_checkpoint(self, directory: str | Path, *, training_state: bool = True) -> dict[str, Any]:
        """Write this trainer's state into exactly ``directory`` (collective).

        The caller made ``directory`` (empty) and owns everything around it: naming (``step_N``),
        writing into a temporary folder and renaming it once every rank returned, ``meta.json``,
        retention and which checkpoint to resume. Every rank writes its part into the same folder:
        the model weights, and with ``training_state`` the optimizer, the LR schedule's position,
        counters and RNG states; nothing is written outside it. Returns the backend's facts for the
        caller's ``meta.json`` (JSON-able, identical on every rank), at least ``{"backend": name}``.
        """
        ...

    def load_checkpoint(self, directory: str | Path, *, weights_only: bool = False) -> None:
        """Restore what :meth:`save_checkpoint` wrote into ``directory`` (collective).

        ``weights_only`` restores the model alone (optimizer, schedule, counters and RNG keep their
        current values); a folder written with ``training_state=False`` needs it.
        """
        ...

    def close(self) -> None:
        """Free memory and leave the process group (idempotent)."""
        ...
