"""The Megatron backend's view of the run config: parallel layout, precision, and its checks.

The rules that need only the config (world divisible by TP×PP×CP, context parallelism without
Transformer Engine, FP8 needs Transformer Engine, the optimizer options that need the distributed or the
precision-aware optimizer, no float16) live in ``telescope_config`` and hold for every validated
config. :func:`megatron_problems` adds the ones that need the model's ``config.json`` (heads,
layers, experts) or this machine (the world size, CUDA, Transformer Engine installed), as
``telescope_config.Problem``s; :func:`check_megatron_settings` raises them all at once in a
``telescope_config.ConfigError`` when the trainer is created.

:func:`params_dtype_name` is the dtype Megatron holds its parameters in: ``mixed_precision_dtype``,
or ``model_dtype`` when that is null (bfloat16 by default; float32 for exact tests);
the optimizer keeps float32 main parameters for bfloat16 ones.

Field notes (what each ``megatron_*`` field does in this backend):

* ``megatron_disable_unified_memory_jit``: megatron-core 0.16 builds its unified-memory extension
  lazily, only when its inference engine asks for a pool; training never does, so there is
  nothing to skip and the field is accepted as is.
* ``megatron_sequence_parallel``: applies only when TP > 1; with TP = 1 it is ignored (Megatron
  would refuse it).
* ``megatron_global_batch_size``: unused (the batch is what the rollout engine hands over).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from telescope_config import ConfigError, Problem, TelescopeConfig
from telescope_trainer_megatron._arch import Architecture

__all__ = [
    "ParallelLayout",
    "check_megatron_settings",
    "megatron_problems",
    "params_dtype_name",
    "te_available",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def te_available() -> bool:
    """Whether NVIDIA Transformer Engine is importable (without importing it)."""
    return importlib.util.find_spec("transformer_engine") is not None


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; a clear error for anything else."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(_DTYPES)}") from None


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of the parallel dimensions; ``dp`` is what is left of the world."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @classmethod
    def from_config(cls, config: TelescopeConfig, world: int) -> ParallelLayout:
        return cls(
            world=world,
            tp=config.megatron_tensor_parallel_size,
            pp=config.megatron_pipeline_parallel_size,
            cp=config.megatron_context_parallel_size,
            ep=config.megatron_expert_parallel_size,
        )


def params_dtype_name(config: TelescopeConfig) -> str:
    """The parameter (compute) dtype: ``mixed_precision_dtype``, else ``model_dtype``."""
    name = config.mixed_precision_dtype or config.model_dtype
    if name not in ("bfloat16", "float32"):
        raise ValueError(
            f"the Megatron backend computes in bfloat16 or float32, got {name!r} from "
            "mixed_precision_dtype/model_dtype; set mixed_precision_dtype: bfloat16"
        )
    return name


_MODEL = "the model's config.json"
_MACHINE = "this machine"
_NEEDS_CUDA = {
    "megatron_fp8": "FP8 needs a CUDA GPU (Hopper or newer)",
    "megatron_optimizer_cpu_offload": "offloading moves optimizer state from the GPU to the CPU; "
    "without CUDA it is already there",
    "megatron_overlap_grad_reduce": "overlapping the gradient reduce needs CUDA streams",
}


def megatron_problems(
    config: TelescopeConfig, arch: Architecture, layout: ParallelLayout, *, has_te: bool, has_cuda: bool
) -> list[Problem]:
    """Every reason this config cannot train this model on this machine, each with a fix."""
    out: list[Problem] = []
    if layout.world != config.trainer_num_workers:
        out.append(
            Problem(
                "trainer_num_workers",
                config.trainer_num_workers,
                f"the torch.distributed world has {layout.world} ranks",
                f"start {config.trainer_num_workers} trainer processes or set trainer_num_workers: "
                f"{layout.world}",
                _MACHINE,
            )
        )
    out += _layout_problems(arch, layout)
    out += _expert_problems(config, arch, layout)
    out += _machine_problems(config, has_te=has_te, has_cuda=has_cuda)
    return out


def _layout_problems(arch: Architecture, layout: ParallelLayout) -> list[Problem]:
    """TP must divide the heads, PP the layers."""
    out: list[Problem] = []
    tp, pp = layout.tp, layout.pp
    if arch.num_heads % tp or arch.num_kv_heads % tp:
        out.append(
            Problem(
                "megatron_tensor_parallel_size",
                tp,
                f"must divide the attention heads ({arch.num_heads}) and key/value heads "
                f"({arch.num_kv_heads}) of {arch.model_type}",
                f"use a common divisor of {arch.num_heads} and {arch.num_kv_heads}",
                _MODEL,
            )
        )
    if arch.num_layers % pp:
        out.append(
            Problem(
                "megatron_pipeline_parallel_size",
                pp,
                f"must divide the number of layers ({arch.num_layers})",
                f"use a divisor of {arch.num_layers}",
                _MODEL,
            )
        )
    return out


def _expert_problems(config: TelescopeConfig, arch: Architecture, layout: ParallelLayout) -> list[Problem]:
    """EP needs experts and must divide them; MoE layers under TP need sequence parallel."""
    out: list[Problem] = []
    ep = layout.ep
    if ep > 1 and not arch.is_moe:
        out.append(
            Problem(
                "megatron_expert_parallel_size",
                ep,
                f"{arch.model_type} has no experts to split",
                "set megatron_expert_parallel_size: 1",
                _MODEL,
            )
        )
    elif ep > 1 and (arch.num_experts or 0) % ep:
        out.append(
            Problem(
                "megatron_expert_parallel_size",
                ep,
                f"must divide the experts ({arch.num_experts})",
                f"use a divisor of {arch.num_experts}",
                _MODEL,
            )
        )
    sequence_parallel = config.megatron_sequence_parallel and config.megatron_use_transformer_engine
    if arch.is_moe and layout.tp > 1 and not sequence_parallel:
        # megatron-core's MoE layer refuses to train under TP without sequence parallel, and this
        # backend runs sequence parallel only on the Transformer Engine layers.
        out.append(
            Problem(
                "megatron_tensor_parallel_size",
                layout.tp,
                f"{arch.model_type} has MoE layers, which megatron-core trains under tensor parallelism "
                "only with sequence parallelism, and that needs the Transformer Engine layers here",
                "set megatron_sequence_parallel: true and megatron_use_transformer_engine: true "
                "(transformer-engine installed), or megatron_tensor_parallel_size: 1 and split the "
                "experts with megatron_expert_parallel_size",
                _MODEL,
            )
        )
    return out


def _machine_problems(config: TelescopeConfig, *, has_te: bool, has_cuda: bool) -> list[Problem]:
    """Transformer Engine asked for but not installed; CUDA-only options without CUDA."""
    out: list[Problem] = []
    if config.megatron_use_transformer_engine and not has_te:
        out.append(
            Problem(
                "megatron_use_transformer_engine",
                True,
                "transformer_engine is not installed",
                "install transformer-engine, or set megatron_use_transformer_engine: false",
                _MACHINE,
            )
        )
    if not has_cuda:
        for field, why in _NEEDS_CUDA.items():
            if getattr(config, field):
                out.append(
                    Problem(field, True, f"{why}, and CUDA is not available", f"set {field}: false", _MACHINE)
                )
    return out


def check_megatron_settings(
    config: TelescopeConfig, arch: Architecture, layout: ParallelLayout, *, has_te: bool, has_cuda: bool
) -> None:
    """Raise a ``telescope_config.ConfigError`` listing every problem of :func:`megatron_problems`."""
    problems = megatron_problems(config, arch, layout, has_te=has_te, has_cuda=has_cuda)
    if problems:
        raise ConfigError(problems, "the Megatron settings for this model and machine")
