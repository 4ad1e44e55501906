"""The Megatron backend's view of the run config: parallel layout, precision, and its checks.

:func:`megatron_problems` lists every impossible ``megatron_*`` combination for a given model and
world size, each with how to fix it; :func:`check_megatron_settings` raises them all at once.
They run when the trainer is created (the model's shape and the world size are needed, so these
are runtime checks, spec §2.3 rule 9, plus the ones upstream left to fail deep inside Megatron).

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
from typing import Any

import torch

from telescope_trainer_megatron._arch import Architecture

__all__ = ["ParallelLayout", "check_megatron_settings", "megatron_problems", "te_available"]

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
    def from_config(cls, config: Any, world: int) -> ParallelLayout:
        return cls(
            world=world,
            tp=config.megatron_tensor_parallel_size,
            pp=config.megatron_pipeline_parallel_size,
            cp=config.megatron_context_parallel_size,
            ep=config.megatron_expert_parallel_size,
        )


def megatron_problems(
    config: Any, arch: Architecture, layout: ParallelLayout, *, has_te: bool, has_cuda: bool
) -> list[str]:
    """Every reason this config cannot train this model on this world, each with a fix."""
    out: list[str] = []
    tp, pp, cp, ep = layout.tp, layout.pp, layout.cp, layout.ep
    if layout.world % (tp * pp * cp):
        out.append(
            f"trainer_num_workers ({layout.world}) must be divisible by megatron_tensor_parallel_size × "
            f"megatron_pipeline_parallel_size × megatron_context_parallel_size = {tp * pp * cp}"
        )
    if arch.num_heads % tp or arch.num_kv_heads % tp:
        out.append(
            f"megatron_tensor_parallel_size ({tp}) must divide the attention heads ({arch.num_heads}) and "
            f"key/value heads ({arch.num_kv_heads}) of the model"
        )
    if arch.num_layers % pp:
        out.append(
            f"megatron_pipeline_parallel_size ({pp}) must divide the number of layers ({arch.num_layers})"
        )
    if ep > 1:
        if not arch.is_moe:
            out.append(
                f"megatron_expert_parallel_size is {ep} but {arch.model_type} has no experts; set it to 1"
            )
        elif (arch.num_experts or 0) % ep:
            out.append(f"megatron_expert_parallel_size ({ep}) must divide the experts ({arch.num_experts})")
        if layout.world % (tp * pp * cp) == 0 and (layout.dp * cp * tp) % ep:
            out.append(
                f"megatron_expert_parallel_size ({ep}) must divide the ranks of one pipeline stage "
                f"({layout.dp * cp * tp})"
            )
    if cp > 1:
        if not has_te:
            out.append(
                "megatron_context_parallel_size > 1 needs Transformer Engine "
                "(pip install transformer-engine); "
                "set it to 1"
            )
        out.append(
            "megatron_context_parallel_size > 1 is not implemented by this backend yet; set it to 1 "
            "(or use fsdp_context_parallel_size with train_backend: fsdp)"
        )
    if config.megatron_use_transformer_engine and not has_te:
        out.append(
            "megatron_use_transformer_engine is true but transformer_engine is not installed; install "
            "transformer-engine or set it to false"
        )
    if config.megatron_fp8:
        if not config.megatron_use_transformer_engine:
            out.append("megatron_fp8 needs megatron_use_transformer_engine: true")
        if not has_cuda:
            out.append("megatron_fp8 needs a CUDA GPU (Hopper or newer); set it to false")
    if config.megatron_use_precision_aware_optimizer and not config.megatron_use_distributed_optimizer:
        out.append("megatron_use_precision_aware_optimizer needs megatron_use_distributed_optimizer: true")
    if config.megatron_optimizer_cpu_offload and not config.megatron_use_distributed_optimizer:
        out.append("megatron_optimizer_cpu_offload needs megatron_use_distributed_optimizer: true")
    if config.megatron_optimizer_cpu_offload and not has_cuda:
        out.append(
            "megatron_optimizer_cpu_offload moves optimizer state from the GPU to the CPU; without CUDA "
            "it is already there: set it to false"
        )
    if not config.megatron_use_precision_aware_optimizer:
        changed = [
            f
            for f in ("main_grads", "main_params", "exp_avg", "exp_avg_sq")
            if getattr(config, f"megatron_{f}_dtype") != "float32"
        ]
        if changed:
            out.append(
                f"megatron_{changed[0]}_dtype only takes effect with megatron_use_precision_aware_optimizer:"
                " true; enable it or leave the dtypes at float32"
            )
    if config.megatron_overlap_grad_reduce and not has_cuda:
        out.append("megatron_overlap_grad_reduce needs CUDA streams; set it to false on CPU")
    return out


def check_megatron_settings(
    config: Any, arch: Architecture, layout: ParallelLayout, *, has_te: bool, has_cuda: bool
) -> None:
    """Raise ``ValueError`` listing every problem of :func:`megatron_problems`."""
    problems = megatron_problems(config, arch, layout, has_te=has_te, has_cuda=has_cuda)
    if problems:
        raise ValueError("the Megatron settings cannot work:\n- " + "\n- ".join(problems))
