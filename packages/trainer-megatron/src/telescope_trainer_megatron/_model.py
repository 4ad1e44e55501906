"""Building the Megatron GPTModel twin of a Hugging Face model and filling it with its weights.

:func:`transformer_config` turns an :class:`~telescope_trainer_megatron._arch.Architecture` plus
the backend's options into a ``TransformerConfig`` (RMSNorm, SiLU-GLU, RoPE, QKV bias, QK norm,
MoE routing; dropout off; full uniform recompute when asked; FP8 e4m3 with Transformer Engine).
:func:`build_gpt_model` picks the layer spec (local modules with
:class:`~telescope_trainer_megatron._attention.PackedDotProductAttention`, or Transformer Engine)
and builds this rank's stage. :func:`load_hf_weights` copies the rank's shard of every parameter
from the safetensors files, converting each tensor on the fly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import structlog
import torch
import torch.nn.functional as F

from telescope_trainer_megatron._arch import Architecture
from telescope_trainer_megatron._convert import hf_sources, hf_to_megatron_tensor
from telescope_trainer_megatron._cpu_shim import CPU_UNFUSED
from telescope_trainer_megatron._hf_io import HFCheckpoint
from telescope_trainer_megatron._settings import ParallelLayout
from telescope_trainer_megatron._shard import to_global_name, tp_shard

__all__ = ["build_gpt_model", "load_hf_weights", "local_to_global", "transformer_config"]

log = structlog.get_logger()


def transformer_config(
    arch: Architecture,
    layout: ParallelLayout,
    *,
    params_dtype: torch.dtype,
    sequence_parallel: bool,
    recompute: bool,
    fp8: bool,
    cpu: bool,
) -> Any:
    """The ``TransformerConfig`` of ``arch`` under this parallel layout and these options."""
    from megatron.core.transformer import TransformerConfig

    kw = {
        **_model_fields(arch, params_dtype),
        **_parallel_fields(layout, sequence_parallel=sequence_parallel),
        **_moe_fields(arch),
    }
    if recompute:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if fp8:
        kw.update(
            fp8="e4m3", fp8_margin=0, fp8_interval=1, fp8_amax_history_len=1024, fp8_amax_compute_algo="max"
        )
    if cpu:
        kw.update(CPU_UNFUSED)
    # Weights are overwritten from the checkpoint, but megatron-core only marks parameters as
    # tensor-parallel inside its initialiser: without it, grad norms under TP > 1 are wrong.
    kw.update(use_cpu_initialization=cpu, perform_initialization=True)
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(kw) - known)
    if unknown:
        raise RuntimeError(f"this megatron-core does not know TransformerConfig fields {unknown}; use 0.16.x")
    return TransformerConfig(**kw)


def _model_fields(arch: Architecture, params_dtype: torch.dtype) -> dict[str, Any]:
    """The dense model: sizes, RMSNorm, SiLU-GLU, QKV bias, QK norm, no dropout, the dtype."""
    return {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_heads,
        "num_query_groups": arch.num_kv_heads,
        "kv_channels": arch.head_dim,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "layernorm_epsilon": arch.rms_norm_eps,
        "normalization": "RMSNorm",
        "activation_func": F.silu,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": arch.qkv_bias,
        "qk_layernorm": arch.qk_norm,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "masked_softmax_fusion": False,
        "calculate_per_token_loss": True,  # the loss is already the step's token mean: no rescaling
    }


def _parallel_fields(layout: ParallelLayout, *, sequence_parallel: bool) -> dict[str, Any]:
    """TP, PP, CP and EP sizes, and how tokens move between the ranks."""
    return {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": 1,
        "sequence_parallel": sequence_parallel and layout.tp > 1,
        # Micro-batches differ in length; only the pipeline's p2p shape exchange needs to know.
        "variable_seq_lengths": layout.pp > 1,
        # Each expert-parallel rank may send a different number of tokens (packed micro-batches
        # differ in length), which megatron-core's alltoall dispatcher handles; on the CPU it runs
        # through the shim's no-stream host copy (``_cpu_shim``). allgather would assume equal
        # token counts on every EP rank.
        "moe_token_dispatcher_type": "alltoall",
        "batch_p2p_comm": False,
    }


def _moe_fields(arch: Architecture) -> dict[str, Any]:
    """Routing of a mixture-of-experts model (none for a dense one); see ``_arch`` for the softmax."""
    if not arch.is_moe:
        return {}
    kw: dict[str, Any] = {
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.moe_topk,
        "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        "moe_router_pre_softmax": arch.moe_pre_softmax,
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,
        "moe_layer_freq": [int(m) for m in arch.moe_layers],
    }
    if arch.shared_expert_size:
        kw["moe_shared_expert_intermediate_size"] = arch.shared_expert_size
        kw["moe_shared_expert_gate"] = arch.shared_expert_gate
    return kw


def _layer_spec(config: Any, use_te: bool) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from telescope_trainer_megatron._attention import PackedDotProductAttention

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization="RMSNorm")
    if not use_te:
        layers: list[Any] = list(spec.layer_specs or [])
        for layer in layers:
            layer.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


def _define_missing_te_gemm() -> None:
    """megatron-core 0.16 leaves ``moe_utils.te_general_gemm`` undefined without Transformer Engine
    (its router then fails with NameError); None selects its plain ``torch.mm`` path."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build_gpt_model(arch: Architecture, config: Any, *, padded_vocab: int, use_te: bool) -> Any:
    """This pipeline stage's ``GPTModel`` (not yet wrapped for data parallelism)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    if arch.is_moe:
        _define_missing_te_gemm()
    return GPTModel(
        config=config,
        transformer_layer_spec=_layer_spec(config, use_te),
        vocab_size=padded_vocab,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=cast(bool, ps.is_pipeline_first_stage()),  # pyright: ignore[reportUnknownMemberType]
        post_process=cast(bool, ps.is_pipeline_last_stage()),  # pyright: ignore[reportUnknownMemberType]
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
    )


def _offsets(model: Any) -> tuple[int, int]:
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    layer_offset = cast(int, get_transformer_layer_offset(model.config))
    experts: int = model.config.num_moe_experts or 0
    ep = cast(int, ps.get_expert_model_parallel_world_size())
    expert_offset = cast(int, ps.get_expert_model_parallel_rank()) * (experts // ep) if experts else 0
    return layer_offset, expert_offset


def local_to_global(model: Any) -> dict[str, str]:
    """This rank's parameter names (``model.named_parameters()``) → global Megatron names."""
    layer_offset, expert_offset = _offsets(model)
    return {
        name: to_global_name(name, layer_offset=layer_offset, expert_offset=expert_offset)
        for name, _ in model.named_parameters()
    }


@torch.no_grad()
def load_hf_weights(model: Any, arch: Architecture, model_dir: str, *, padded_vocab: int) -> int:
    """Copy this rank's shard of every parameter from the Hugging Face folder; return the count."""
    from megatron.core import parallel_state as ps

    ckpt = HFCheckpoint(model_dir)
    tp_rank = cast(int, ps.get_tensor_model_parallel_rank())
    tp = cast(int, ps.get_tensor_model_parallel_world_size())
    names = local_to_global(model)
    params = dict(model.named_parameters())
    for local, name in names.items():
        sources = [ckpt.get(s) for s in hf_sources(name, arch)]
        full = hf_to_megatron_tensor(name, sources, arch, padded_vocab)
        shard = tp_shard(name, full, tp_rank, tp)
        if shard.shape != params[local].shape:
            raise ValueError(
                f"{name}: converted shape {tuple(shard.shape)} does not match the Megatron parameter "
                f"{tuple(params[local].shape)} (config.json and weights disagree?)"
            )
        params[local].copy_(shard)
    log.debug("megatron.weights_loaded", count=len(names), model_dir=model_dir)
    return len(names)
