"""telescope-trainer-fsdp: the FSDP2 training backend of Telescope (``train_backend: fsdp``).

``create_trainer(config)`` loads a Hugging Face causal LM, shards it per decoder layer with FSDP2
and returns an :class:`FSDPTrainer` implementing ``telescope_algos.backend.TrainerBackend``: exact packed
training (samples sharing a row never attend to each other; each update is the token mean of the
whole step over micro-batches and ranks), AdamW with clipping and skipped non-finite steps, LR
schedules, streamed Hugging Face weights for weight sync, and DCP checkpoints written into the
folder the caller gives, which :func:`convert_checkpoint` turns into a Hugging Face safetensors
folder. The module registers itself in the ``telescope.trainers`` entry-point group under
:data:`BACKEND_NAME`.
"""

from telescope_trainer_fsdp.__about__ import __version__
from telescope_trainer_fsdp._export import convert_checkpoint
from telescope_trainer_fsdp._lora import adapter_config
from telescope_trainer_fsdp._schedule import SCHEDULES, lr_multiplier
from telescope_trainer_fsdp._trainer import FSDPTrainer, create_trainer

BACKEND_NAME = "fsdp"

__all__ = [
    "BACKEND_NAME",
    "SCHEDULES",
    "FSDPTrainer",
    "__version__",
    "adapter_config",
    "convert_checkpoint",
    "create_trainer",
    "lr_multiplier",
]
