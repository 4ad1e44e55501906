"""LoRA adapters (PEFT) on the frozen base model: the adapter the servers receive, and the model merged.

* :func:`add_adapters` wraps the loaded model with PEFT's ``get_peft_model`` before it is sharded:
  a ``LoraConfig`` from ``lora_rank``, ``lora_alpha``, ``lora_dropout`` and ``lora_target_modules``.
  The base weights are frozen (no gradient, no optimizer state); each target linear layer gets
  ``A`` (rank x in, random) and ``B`` (out x rank, zeros), so step 0 is the base model exactly.
  A target that matches no layer, or a rank above a target layer's smaller dimension, is refused
  with the layer and the fix.
* :func:`merged_hf_weights` streams the model as Hugging Face tensors with every adapter merged,
  ``W + (lora_alpha / lora_rank) B A`` (computed in float32), under the base model's names: what
  ``telescope convert --merge`` writes, and what a vLLM server without LoRA would serve. Like
  ``_export.iter_hf_weights`` it gathers one parameter at a time and is collective over the FSDP
  group.

* :func:`adapters_off`: inside it the model is its base alone (PEFT's ``disable_adapter``): with
  LoRA the reference model of the reference KL, when it is the starting weights, is the policy's own
  base, so the trainer computes its logprobs there instead of loading the base a second time.

* :func:`adapter_weights` streams the adapter alone under PEFT's names, and :func:`adapter_config`
  gives its ``adapter_config.json``: what a vLLM server with LoRA loads (docs/weightsync.md, "LoRA
  adapters"), and what ``telescope convert`` writes.

PEFT is the extra ``telescope-trainer-fsdp[lora]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor

from telescope_trainer_fsdp._export import hf_name

__all__ = [
    "ADAPTER",
    "adapter_config",
    "adapter_weights",
    "adapters_off",
    "add_adapters",
    "lora_settings",
    "merged_hf_weights",
    "peft_name",
]

ADAPTER = "default"
"""PEFT's adapter name (the one adapter a Telescope model carries)."""
_PREFIX = "base_model.model."
"""What PEFT puts before the base model's parameter names."""


def lora_settings(config: Any) -> dict[str, Any] | None:
    """The run's LoRA settings (``rank``, ``alpha``, ``dropout``, ``targets``), or None without LoRA."""
    rank = int(getattr(config, "lora_rank", 0) or 0)
    if rank <= 0:
        return None
    return {
        "rank": rank,
        "alpha": float(config.lora_alpha),
        "dropout": float(config.lora_dropout),
        "targets": list(config.lora_target_modules),
    }


def add_adapters(model: torch.nn.Module, settings: dict[str, Any]) -> torch.nn.Module:
    """``model`` with trainable LoRA adapters on its target layers, the rest frozen (see the module)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("lora_rank > 0 needs PEFT: pip install 'telescope-trainer-fsdp[lora]'") from exc
    rank, targets = settings["rank"], settings["targets"]
    found = {name.rsplit(".", 1)[-1] for name, _ in _linear_layers(model)}
    missing = [t for t in targets if t.rsplit(".", 1)[-1] not in found]
    if missing:
        raise ValueError(
            f"lora_target_modules {missing} match no linear layer of {type(model).__name__}; its linear "
            f"layers are {sorted(found)}: list some of those"
        )
    for name, module in _linear_layers(model):
        if _targeted(name, targets):
            smaller = min(module.in_features, module.out_features)
            if rank > smaller:
                raise ValueError(
                    f"lora_rank {rank} is larger than layer {name} ({module.in_features} -> "
                    f"{module.out_features}) allows: a rank above {smaller} adds nothing; use lora_rank "
                    f"<= {smaller}, or leave that layer out of lora_target_modules"
                )
    lora = LoraConfig(
        r=rank,
        lora_alpha=settings["alpha"],
        lora_dropout=settings["dropout"],
        target_modules=targets,
        bias="none",
    )
    return get_peft_model(model, lora)


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Generator[None]:
    """Inside: ``model`` (a PEFT model, sharded or not) computes with its base weights alone, every
    adapter bypassed; they are back on the way out, an exception included."""
    with cast(Any, model).disable_adapter():  # PEFT types its context manager loosely
        yield


def adapter_config(settings: dict[str, Any], *, base: str = "") -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of the run's adapter, as a JSON-able dict (what vLLM and
    ``PeftModel.from_pretrained`` read); ``base`` is the base model's id or folder."""
    from peft import LoraConfig

    alpha: Any = float(settings["alpha"])  # PEFT annotates an int; a float scales the same (alpha / r)
    peft_config = LoraConfig(
        r=int(settings["rank"]),
        lora_alpha=alpha,
        lora_dropout=float(settings["dropout"]),
        target_modules=list(settings["targets"]),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base or None,
    )
    config = cast("dict[str, Any]", peft_config.to_dict())  # PEFT annotates a bare Dict
    return {k: sorted(cast("set[Any]", v)) if isinstance(v, set) else v for k, v in config.items()}


def peft_name(name: str) -> str:
    """An adapter tensor's name in PEFT's saved format: the Hugging Face name without the adapter's
    own name (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    return hf_name(name).replace(f".{ADAPTER}.", ".")


def adapter_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(PEFT name, full tensor)`` of every adapter tensor (``lora_A``, ``lora_B``); collective."""
    for name, tensor in model.named_parameters():
        if f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name:
            full = _full(tensor)
            yield peft_name(name), full
            del full


def _linear_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Linear]]:
    """``(name, layer)`` of every linear layer in ``model``."""
    modules = cast("Iterator[tuple[str, torch.nn.Module]]", model.named_modules())  # not annotated by torch
    for name, module in modules:
        if isinstance(module, torch.nn.Linear):
            yield name, module


def _targeted(name: str, targets: list[str]) -> bool:
    """PEFT's rule for a list of names: the module's name is a target or ends with ``.target``."""
    return any(name == t or name.endswith(f".{t}") for t in targets)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def merged_hf_weights(
    model: torch.nn.Module, settings: dict[str, Any], *, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor)`` of the base model with the adapters merged; collective."""
    scale = settings["alpha"] / settings["rank"]
    params = dict(model.named_parameters())
    persistent = set(model.state_dict().keys())
    named = list(params.items()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
    for pname, tensor in named:
        if f".lora_A.{ADAPTER}." in pname or f".lora_B.{ADAPTER}." in pname:
            continue  # merged into their layer's weight below
        full, name = _full(tensor), pname.replace(".base_layer.", ".")
        if pname.endswith(".base_layer.weight"):
            layer = pname[: -len(".base_layer.weight")]
            a = _full(params[f"{layer}.lora_A.{ADAPTER}.weight"]).float()
            b = _full(params[f"{layer}.lora_B.{ADAPTER}.weight"]).float()
            full = (full.float() + scale * (b @ a)).to(full.dtype)
        if dtype is not None:
            full = full.to(dtype)
        out = hf_name(name)
        yield (out[len(_PREFIX) :] if out.startswith(_PREFIX) else out), full
        del full
