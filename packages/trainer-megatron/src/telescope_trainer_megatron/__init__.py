"""telescope-trainer-megatron: the Megatron-core training backend of Telescope.

``create_trainer(config, model_path=None, seed=None, **options)`` returns a :class:`MegatronTrainer`
implementing ``telescope_algos.backend.TrainerBackend`` (registered as ``megatron`` in the
``telescope.trainers`` entry-point group); ``convert_checkpoint(directory, out_dir)`` turns a
folder its ``save_checkpoint`` wrote into a Hugging Face safetensors folder in a plain process
(no torch.distributed, no megatron-core). Also public: the Hugging Face ⇄ Megatron weight
conversion (exact both ways), the model facts read from ``config.json``, the validation of the
``megatron_*`` settings, and the CPU shim that lets megatron-core run without CUDA.
Heavy imports (megatron-core, the ``[megatron]`` extra) happen when a trainer is created, not at
import; without it, ``create_trainer`` raises an ImportError that names the extra
(``_requirements``).
"""

from telescope_algos import lr_multiplier
from telescope_trainer_megatron.__about__ import __version__
from telescope_trainer_megatron._arch import SUPPORTED_MODEL_TYPES, Architecture, padded_vocab_size
from telescope_trainer_megatron._checkpoint import convert_checkpoint
from telescope_trainer_megatron._convert import hf_to_megatron, megatron_names, megatron_to_hf
from telescope_trainer_megatron._cpu_shim import install_cpu_shim, uninstall_cpu_shim
from telescope_trainer_megatron._settings import (
    ParallelLayout,
    check_megatron_settings,
    megatron_problems,
    params_dtype_name,
)
from telescope_trainer_megatron._shard import tp_merge, tp_shard
from telescope_trainer_megatron._trainer import MegatronTrainer, create_trainer

BACKEND_NAME = "megatron"

__all__ = [
    "BACKEND_NAME",
    "SUPPORTED_MODEL_TYPES",
    "Architecture",
    "MegatronTrainer",
    "ParallelLayout",
    "__version__",
    "check_megatron_settings",
    "convert_checkpoint",
    "create_trainer",
    "hf_to_megatron",
    "install_cpu_shim",
    "lr_multiplier",
    "megatron_names",
    "megatron_problems",
    "megatron_to_hf",
    "padded_vocab_size",
    "params_dtype_name",
    "tp_merge",
    "tp_shard",
    "uninstall_cpu_shim",
]
