"""Setting up a Megatron trainer: process groups, seeds, the DDP wrapper and Adam (collective).

:func:`init_distributed` joins (or creates, from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``) the default process group: gloo on CPU, NCCL on GPU. :func:`init_model_parallel`
splits it into megatron-core's TP, PP, CP and EP groups (expert TP 1). :func:`seed_ranks` seeds
Python, NumPy and torch with ``seed`` and megatron's RNG tracker with ``seed + 100 · pipeline
rank``. :func:`wrap_ddp` is Megatron's DDP wrapper (fp32 grad buffers, overlap, distributed
optimizer as configured) and :func:`build_optimizer` Megatron's Adam with decoupled weight decay,
like AdamW. Every megatron-core import happens inside these functions.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, cast

import structlog
import torch
import torch.distributed as dist

from telescope_algos.backend import seed_everything
from telescope_config import TelescopeConfig
from telescope_trainer_megatron._cpu_shim import cuda_type_names
from telescope_trainer_megatron._settings import ParallelLayout, torch_dtype

__all__ = [
    "build_optimizer",
    "init_distributed",
    "init_model_parallel",
    "seed_ranks",
    "sequence_parallel",
    "wrap_ddp",
]

log = structlog.get_logger()


def init_distributed(timeout_s: float) -> bool:
    """Initialise the default process group from the environment unless done; True if we did."""
    if dist.is_initialized():
        return False
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and {missing} are not set; launch with torchrun or "
            "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
        )
    if torch.cuda.is_available():
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend="nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(seconds=timeout_s)
    )
    return True


def init_model_parallel(layout: ParallelLayout) -> None:
    """megatron-core's parallel groups for ``layout`` (kept when they already exist)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=1,
        )


def seed_ranks(seed: int) -> None:
    """Python, NumPy and torch with ``seed``, then megatron's tracker (and CUDA) with
    ``seed + 100 · pipeline rank``. On the CPU the shim routes its ``torch.cuda.manual_seed`` to
    ``torch.manual_seed``, so there the CPU generator ends at ``seed + 100 · pipeline rank``."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    seed_everything(seed)
    model_parallel_cuda_manual_seed(seed + 100 * cast(int, ps.get_pipeline_model_parallel_rank()))


def sequence_parallel(config: TelescopeConfig, layout: ParallelLayout) -> bool:
    """Whether sequence parallelism runs: asked for, under TP > 1, on the Transformer Engine layers
    (megatron-core's local RMSNorm cannot shard the sequence: a warning says so and it stays off)."""
    wanted = bool(config.megatron_sequence_parallel) and layout.tp > 1
    if wanted and not config.megatron_use_transformer_engine:
        log.warning(
            "megatron.sequence_parallel_off",
            reason="sequence parallel needs the Transformer Engine layers; running TP without it",
            fix="set megatron_use_transformer_engine: true (with transformer-engine installed)",
        )
        return False
    return wanted


def wrap_ddp(config: TelescopeConfig, tf_config: Any, module: Any) -> Any:
    """Megatron's ``DistributedDataParallel`` around ``module``; gradients are summed, not divided by
    the token count (the loss already is the step's token mean)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=bool(config.megatron_grad_reduce_in_fp32),
        overlap_grad_reduce=bool(config.megatron_overlap_grad_reduce),
        use_distributed_optimizer=bool(config.megatron_use_distributed_optimizer),
    )
    model = DistributedDataParallel(tf_config, ddp_config, module)
    tf_config.finalize_model_grads_func = _finalize_without_token_scaling(finalize_model_grads)
    return model


def _finalize_without_token_scaling(finalize: Any) -> Any:
    """Megatron's grad finalisation minus its division by the token count: our loss is already a mean."""

    def wrapped(model: Any, num_tokens: Any = None, **kwargs: Any) -> None:
        finalize(model, None, **kwargs)

    return wrapped


def build_optimizer(
    config: TelescopeConfig,
    model: Any,
    *,
    params_dtype: torch.dtype,
    betas: tuple[float, float],
    eps: float,
) -> Any:
    """Megatron's Adam (decoupled weight decay) over ``model``, with the config's precision and
    offloading options; the learning rate is set per step by the trainer."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_eps=eps,
        clip_grad=config.grad_clip,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        params_dtype=params_dtype,
        use_distributed_optimizer=bool(config.megatron_use_distributed_optimizer),
        optimizer_cpu_offload=bool(config.megatron_optimizer_cpu_offload),
        optimizer_offload_fraction=float(config.megatron_optimizer_offload_fraction),
        overlap_cpu_optimizer_d2h_h2d=bool(config.megatron_overlap_cpu_optimizer_d2h_h2d),
        use_precision_aware_optimizer=bool(config.megatron_use_precision_aware_optimizer),
        main_grads_dtype=torch_dtype(config.megatron_main_grads_dtype),
        main_params_dtype=torch_dtype(config.megatron_main_params_dtype),
        exp_avg_dtype=torch_dtype(config.megatron_exp_avg_dtype),
        exp_avg_sq_dtype=torch_dtype(config.megatron_exp_avg_sq_dtype),
    )
    with cuda_type_names():
        return get_megatron_optimizer(opt_config, [model])
