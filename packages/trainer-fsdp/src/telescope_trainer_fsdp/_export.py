"""Weights out of the trainer: streamed Hugging Face tensors for weight sync, and checkpoint → safetensors.

* :func:`iter_hf_weights` gathers one parameter at a time (``DTensor.full_tensor()``, a collective),
  so no rank ever holds the full model at once (not even for a moment: there is no full state
  dict gathered on every rank). Names are the Hugging Face names; tied weights appear
  once (``lm_head.weight`` is left out when tied, as ``save_pretrained`` does).
* :func:`convert_checkpoint` reads the ``model.*`` tensors of a DCP checkpoint without a process
  group, a few hundred MB at a time, and writes ``model.safetensors`` (or shards plus
  ``model.safetensors.index.json``) next to the checkpoint's ``hf_meta`` files, a folder that
  ``AutoModelForCausalLM.from_pretrained`` loads. A LoRA checkpoint (``lora.json``) comes out
  merged, ``W + (alpha / rank) B A`` under the base model's names, or with ``adapter_only`` as the
  adapter alone in PEFT's format (``PeftModel.from_pretrained(base, out)``).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint import state_dict_loader
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor

from telescope_trainer_fsdp import _checkpoint as ck

__all__ = ["convert_checkpoint", "hf_name", "iter_hf_weights"]

# torch annotates its checkpoint_id with a bare os.PathLike: it is taken through Any
dcp_load: Callable[..., None] = cast(Any, state_dict_loader).load

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def hf_name(name: str) -> str:
    """A parameter's Hugging Face name: without the wrappers' parts (checkpointing, compile, FSDP)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def iter_hf_weights(
    model: torch.nn.Module, *, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor)`` per parameter and persistent buffer; collective over the FSDP group."""
    persistent = set(model.state_dict().keys())
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
    for name, tensor in named:
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        full = full.detach()
        if dtype is not None:
            full = full.to(dtype)
        yield hf_name(name), full
        del full


def _plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def convert_checkpoint(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 1024**3,
    adapter_only: bool = False,
) -> Path:
    """Turn a folder written by ``FSDPTrainer.save_checkpoint`` into a Hugging Face folder.

    Args:
        checkpoint_dir: a checkpoint folder (``step_<N>``; runs without torch.distributed).
        out_dir: created if needed; receives safetensors, config and tokenizer files.
        dtype: cast the weights (e.g. ``torch.bfloat16``); default keeps the trained dtype.
        max_shard_bytes: largest safetensors file before sharding.
        adapter_only: a LoRA checkpoint's adapter alone, in PEFT's format (``adapter_config.json``
            and ``adapter_model.safetensors``, for ``PeftModel.from_pretrained`` or vLLM's
            ``--lora-modules``); a checkpoint of the full model has none (``ValueError``). By
            default a LoRA checkpoint comes out merged.

    Returns:
        ``out_dir`` as a Path.
    """
    ckpt = ck.check_folder(checkpoint_dir)
    hf_meta = ckpt / ck.HF_META_DIR
    config = json.loads((hf_meta / "config.json").read_text(encoding="utf-8"))
    reader = FileSystemReader(str(ckpt))
    entries = _model_entries(reader, tied=bool(config.get("tie_word_embeddings", False)))
    if not entries:
        raise ValueError(f"{ckpt} holds no model tensors")
    lora_file = ckpt / ck.LORA_FILE
    if adapter_only and not lora_file.is_file():
        raise ValueError(f"{ckpt} trained the full model (lora_rank 0): it has no adapter to export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merge = None
    if lora_file.is_file():
        lora = json.loads(lora_file.read_text(encoding="utf-8"))
        adapters = _read(reader, {k: md for k, md in entries.items() if _is_adapter(k)})
        if adapter_only:
            _write_adapter(out, adapters, lora, base=str(config.get("_name_or_path") or ""))
            return out
        entries = {k: md for k, md in entries.items() if not _is_adapter(k)}
        merge = _Merge(adapters, lora["alpha"] / lora["rank"])
    for f in hf_meta.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)

    def nbytes(md: TensorStorageMetadata) -> int:
        want = dtype or md.properties.dtype
        return md.size.numel() * torch.empty((), dtype=want).element_size()

    shards = _plan_shards({k: nbytes(md) for k, md in entries.items()}, max_shard_bytes)
    _write_shards(reader, entries, shards, out, dtype=dtype, merge=merge)
    return out


_LORA_PREFIX = "model.base_model.model."
"""A LoRA checkpoint's model keys: PEFT's wrapper around the base model's names."""


def _is_adapter(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def _read(reader: FileSystemReader, entries: dict[str, TensorStorageMetadata]) -> dict[str, torch.Tensor]:
    state = {k: torch.empty(md.size, dtype=md.properties.dtype) for k, md in entries.items()}
    if state:
        with warnings.catch_warnings():  # "torch.distributed is disabled ...": reading alone is the point
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(state, storage_reader=reader, no_dist=True)
    return state


class _Merge:
    """Names and merged weights of a LoRA checkpoint's base tensors (the adapters read up front)."""

    def __init__(self, adapters: dict[str, torch.Tensor], scale: float) -> None:
        self.adapters, self.scale = adapters, scale

    def __call__(self, key: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        name = hf_name(key[len(_LORA_PREFIX) :]).replace(".base_layer.", ".")
        if key.endswith(".base_layer.weight"):
            layer = key[: -len(".base_layer.weight")]
            a = self.adapters[f"{layer}.lora_A.default.weight"].float()
            b = self.adapters[f"{layer}.lora_B.default.weight"].float()
            tensor = (tensor.float() + self.scale * (b @ a)).to(tensor.dtype)
        return name, tensor


def _write_adapter(
    folder: Path, adapters: dict[str, torch.Tensor], lora: dict[str, Any], *, base: str
) -> None:
    """The adapter alone in PEFT's format: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    from telescope_trainer_fsdp._lora import adapter_config, peft_name
    from telescope_weightsync import write_adapter

    # the checkpoint's keys carry the trainer state's leading "model."
    tensors = {peft_name(k[len("model.") :]): t for k, t in adapters.items()}
    write_adapter(folder, adapter_config(lora, base=base), tensors)


def _model_entries(reader: FileSystemReader, *, tied: bool) -> dict[str, TensorStorageMetadata]:
    """The ``model.*`` tensors of a DCP checkpoint (without the output layer when it is tied)."""
    metadata = reader.read_metadata().state_dict_metadata
    entries = {
        key: md
        for key, md in metadata.items()
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata)
    }
    if tied:
        entries.pop("model.lm_head.weight", None)
        entries.pop(f"{_LORA_PREFIX}lm_head.weight", None)
    return entries


def _write_shards(
    reader: FileSystemReader,
    entries: dict[str, TensorStorageMetadata],
    shards: list[list[str]],
    out: Path,
    *,
    dtype: torch.dtype | None,
    merge: _Merge | None = None,
) -> None:
    """Read each shard's tensors from the checkpoint and write them as safetensors (plus the index
    when there is more than one file); ``merge`` names and merges a LoRA checkpoint's tensors."""
    import safetensors.torch

    # safetensors annotates the file name with a bare os.PathLike: save_file is taken through Any
    save_file: Callable[..., None] = cast(Any, safetensors.torch).save_file

    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map: dict[str, str] = {}
    total = 0
    for keys, fname in zip(shards, names, strict=True):
        state = _read(reader, {k: entries[k] for k in keys})
        tensors: dict[str, torch.Tensor] = {}
        for k in keys:
            name, t = (hf_name(k[len("model.") :]), state.pop(k)) if merge is None else merge(k, state.pop(k))
            tensors[name] = (t if dtype is None else t.to(dtype)).contiguous()
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
