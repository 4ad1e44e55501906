"""Load a Hugging Face causal LM and shard it with FSDP2.

* ``AutoModelForCausalLM`` in ``model_dtype``, ``use_cache`` off, gradient checkpointing
  (non-reentrant) on by default.
* Attention: ``flash_attention_2`` when flash-attn is importable on a GPU, else SDPA on a GPU, and
  ``telescope_packed_sdpa`` (``_packed_attention``: fused causal SDPA per sample) on CPU. Packed rows
  are exact with all of them: the forward passes ``position_ids`` (restarting at 0 per sample) and no
  ``attention_mask``, so flash-attn runs its varlen kernel, transformers' mask builder (for SDPA and
  eager) detects the packed layout and adds a segment mask, and the CPU kernel cuts the row into its
  samples; samples sharing a row never attend to each other, whichever kernel runs.
* With LoRA (``lora_rank`` > 0) the model gets PEFT adapters before sharding (``_lora``).
* ``fully_shard`` on every module whose class is in ``_no_split_modules`` (the decoder layers), on
  untied input embeddings, then on the root; ``MixedPrecisionPolicy(param_dtype=mixed_precision_dtype,
  reduce_dtype=float32)``.
* A frozen model (a teacher or reference model held beside the policy: ``load_frozen_model``) is
  loaded and sharded the same way, without gradient checkpointing or adapters, every parameter
  frozen, in eval mode: each rank holds its shard, and a forward gathers one layer at a time.
"""

from __future__ import annotations

import importlib.util
from typing import Any, cast

import structlog
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from telescope_trainer_fsdp._packed_attention import PACKED_SDPA, register_packed_sdpa

__all__ = ["DTYPES", "attention_implementation", "load_frozen_model", "load_sharded_model", "torch_dtype"]

_log = structlog.get_logger()

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; a clear error for anything else."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def attention_implementation(device: torch.device, requested: str | None = None) -> str:
    """The attention kernel: ``requested`` if given, else flash-attn on CUDA when installed, else SDPA
    on CUDA, and the per-sample SDPA on CPU."""
    if requested is not None:
        return requested
    if device.type == "cpu":
        return PACKED_SDPA
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def load_sharded_model(
    model_path: str,
    *,
    device: torch.device,
    model_dtype: str,
    mixed_precision_dtype: str | None,
    gradient_checkpointing: bool = True,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    lora: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Load ``model_path`` on ``device`` and return it wrapped by FSDP2 (collective: every rank calls it);
    with ``lora`` (``_lora.lora_settings``) the base model is frozen and carries PEFT adapters."""
    from transformers import AutoModelForCausalLM

    attn = attention_implementation(device, attn_implementation)
    if attn == PACKED_SDPA:
        register_packed_sdpa()
    # transformers leaves parts of from_pretrained and of the model's API unannotated (and mistypes
    # `to`): the model is untyped until it is a plain module
    hf_model = cast(Any, AutoModelForCausalLM).from_pretrained(
        model_path,
        dtype=torch_dtype(model_dtype),
        attn_implementation=attn,
        trust_remote_code=trust_remote_code,
    )
    hf_model.config.use_cache = False
    if gradient_checkpointing:
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model: torch.nn.Module = hf_model
    if lora is not None:
        from telescope_trainer_fsdp._lora import add_adapters

        model = add_adapters(model, lora)
    model.to(device)
    if mixed_precision_dtype is None:
        mp = MixedPrecisionPolicy()
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch_dtype(mixed_precision_dtype), reduce_dtype=torch.float32)
    layer_classes: set[str] = set(getattr(model, "_no_split_modules", None) or ())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    units = [
        m
        for m in model.modules()
        if type(m).__name__ in layer_classes or (isinstance(m, torch.nn.Embedding) and not tied)
    ]
    if not any(type(m).__name__ in layer_classes for m in units):
        raise ValueError(
            f"{type(model).__name__} names no decoder-layer class in _no_split_modules "
            f"({sorted(layer_classes) or 'none'}): cannot shard it per layer"
        )
    for module in units:
        fully_shard(module, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.train()  # from_pretrained returns eval mode; checkpointing only acts in training mode
    _log.debug("model sharded", model=model_path, attention=attn, units=len(units), tied=tied)
    return model


def load_frozen_model(
    model_path: str,
    *,
    device: torch.device,
    model_dtype: str,
    mixed_precision_dtype: str | None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """``model_path`` sharded like the policy (collective), every parameter frozen, in eval mode: a
    teacher or reference model whose logprobs a step computes without gradients."""
    model = load_sharded_model(
        model_path,
        device=device,
        model_dtype=model_dtype,
        mixed_precision_dtype=mixed_precision_dtype,
        gradient_checkpointing=False,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    model.requires_grad_(False)
    return model.eval()
