"""Weights out of the trainer: streamed Hugging Face tensors for weight sync, and checkpoint → safetensors.

* :func:`iter_hf_weights` gathers one parameter at a time (``DTensor.full_tensor()``, a collective),
  so no rank ever holds the full model at once (not even for a moment: there is no full state
  dict gathered on every rank). Names are the Hugging Face names; tied weights appear
  once (``lm_head.weight`` is left out when tied, as ``save_pretrained`` does).
* :func:`convert_checkpoint` reads the ``model.*`` tensors of a DCP checkpoint without a process
  group, a few hundred MB at a time, and writes ``model.safetensors`` (or shards plus
  ``model.safetensors.index.json``) next to the checkpoint's ``hf_meta`` files, a folder that
  ``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.tensor import DTensor

from telescope_trainer_fsdp import _checkpoint as ck

__all__ = ["convert_checkpoint", "iter_hf_weights"]

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _hf_name(name: str) -> str:
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
        yield _hf_name(name), full
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
) -> Path:
    """Turn a folder written by ``FSDPTrainer.save_checkpoint`` into a Hugging Face folder.

    Args:
        checkpoint_dir: a checkpoint folder (``step_<N>``; runs without torch.distributed).
        out_dir: created if needed; receives safetensors, config and tokenizer files.
        dtype: cast the weights (e.g. ``torch.bfloat16``); default keeps the trained dtype.
        max_shard_bytes: largest safetensors file before sharding.

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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in hf_meta.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)

    def nbytes(md: TensorStorageMetadata) -> int:
        want = dtype or md.properties.dtype
        return md.size.numel() * torch.empty((), dtype=want).element_size()

    shards = _plan_shards({k: nbytes(md) for k, md in entries.items()}, max_shard_bytes)
    _write_shards(reader, entries, shards, out, dtype=dtype)
    return out


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
    return entries


def _write_shards(
    reader: FileSystemReader,
    entries: dict[str, TensorStorageMetadata],
    shards: list[list[str]],
    out: Path,
    *,
    dtype: torch.dtype | None,
) -> None:
    """Read each shard's tensors from the checkpoint and write them as safetensors (plus the index
    when there is more than one file)."""
    from safetensors.torch import save_file

    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map: dict[str, str] = {}
    total = 0
    for keys, fname in zip(shards, names, strict=True):
        state = {k: torch.empty(entries[k].size, dtype=entries[k].properties.dtype) for k in keys}
        with warnings.catch_warnings():  # "torch.distributed is disabled ...": reading alone is the point
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(state, storage_reader=reader, no_dist=True)
        tensors = {}
        for k in keys:
            t = state.pop(k)
            tensors[_hf_name(k[len("model.") :])] = (t if dtype is None else t.to(dtype)).contiguous()
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
