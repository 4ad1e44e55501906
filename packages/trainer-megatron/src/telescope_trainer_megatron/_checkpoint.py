"""Checkpoint folder of the Megatron backend: per-rank shards plus a ready Hugging Face folder.

The caller (the orchestrator) owns the checkpoint *layout around* the folder: its name (``step_N``), the
temporary folder renamed once every rank returned, its ``meta.json``, retention and finding the
latest. ``MegatronTrainer.save_checkpoint(directory)`` writes into exactly ``directory`` (made,
empty, by the caller) and nothing outside it::

    <directory>/
      layout.json          rank 0: backend "megatron", format, training_state, base_model, vocab and
                           padded vocab sizes, world size, TP/PP/CP/EP sizes, params_dtype (the facts
                           save_checkpoint also returns for the caller's meta.json)
      hf/                  rank 0: config, tokenizer and model safetensors (the whole model in Hugging
                           Face names): loadable by transformers and vLLM; convert_checkpoint copies it
      shards/rank_R.pt     training_state only, every rank R: its model shard, optimizer state (Adam
                           moments, fp32 main params), scheduler_step, skipped_steps_total and RNG
                           states (torch, megatron's tracker, python, numpy, CUDA)

Format choice: each rank saves and loads exactly its own state with ``torch.save``, which is
simple and exact but means **a full resume needs the same world/TP/PP/CP/EP layout and
params dtype** (checked against ``layout.json``, with a clear error). A weights-only load reads
``hf/`` instead, so it works under any layout; so does starting a new run with
``model: <directory>/hf``. A folder written with ``training_state=False`` has no shards and loads
with ``weights_only=True`` only. Folders of the previous format (a backend-written ``meta.json``
in place of ``layout.json``, always with shards) still load and convert.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import torch

from telescope_algos.backend import rng_state as algos_rng_state
from telescope_algos.backend import set_rng_state as algos_set_rng_state

__all__ = [
    "BACKEND",
    "FORMAT",
    "HF_DIR",
    "HF_META_FILES",
    "LAYOUT_FILE",
    "LAYOUT_KEYS",
    "convert_checkpoint",
    "copy_hf_meta",
    "layout_mismatch",
    "optimizer_state",
    "read_layout",
    "rng_state",
    "set_optimizer_state",
    "set_rng_state",
    "shard_path",
    "write_layout",
]

BACKEND = "megatron"
FORMAT = 2
"""Version of this folder format (1: the previous format, with the backend's own meta.json)."""
LAYOUT_FILE = "layout.json"
HF_DIR = "hf"
LAYOUT_KEYS = ("world_size", "tp_size", "pp_size", "cp_size", "ep_size", "params_dtype", "padded_vocab_size")
"""What must be equal to resume the training state (each rank reads exactly its own shard)."""
_LEGACY_META = "meta.json"

HF_META_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def shard_path(directory: Path, rank: int) -> Path:
    return directory / "shards" / f"rank_{rank:05d}.pt"


def _sub_optimizers(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _main_params(opt: Any) -> list[list[torch.Tensor]]:
    for attr in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
        groups = getattr(opt, attr, None)
        if groups:
            return groups
    return []


def optimizer_state(optimizer: Any) -> list[dict[str, Any]]:
    """Adam state and fp32 main parameters of every sub-optimizer (this rank's share)."""
    out: list[dict[str, Any]] = []
    for opt in _sub_optimizers(optimizer):
        inner = getattr(opt, "optimizer", None)
        out.append(
            {
                "inner": inner.state_dict() if inner is not None else None,
                "main_params": [[p.detach().clone() for p in g] for g in _main_params(opt)],
            }
        )
    return out


@torch.no_grad()
def set_optimizer_state(optimizer: Any, state: list[dict[str, Any]]) -> None:
    """Inverse of :func:`optimizer_state` for an optimizer built with the same layout."""
    subs = _sub_optimizers(optimizer)
    if len(subs) != len(state):
        raise ValueError(f"checkpoint has {len(state)} optimizers, the model {len(subs)}: layouts differ")
    for opt, saved in zip(subs, state, strict=True):
        if saved["inner"] is not None:
            opt.optimizer.load_state_dict(saved["inner"])
        for group, saved_group in zip(_main_params(opt), saved["main_params"], strict=True):
            for p, s in zip(group, saved_group, strict=True):
                p.copy_(s)


def rng_state() -> dict[str, Any]:
    """``telescope_algos.backend.rng_state`` (Python, NumPy, torch, CUDA) plus megatron's RNG tracker."""
    return {**algos_rng_state(), "tracker": _rng_tracker().get_states()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    algos_set_rng_state(state)
    _rng_tracker().set_states(state["tracker"])


def _rng_tracker() -> Any:
    """megatron's model-parallel RNG tracker (made by ``model_parallel_cuda_manual_seed``)."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    if tracker is None:
        raise RuntimeError("megatron's RNG tracker is not initialised: build the trainer first")
    return tracker


def write_layout(directory: Path, facts: dict[str, Any]) -> None:
    """Write ``layout.json`` (rank 0): the facts :func:`read_layout` and ``load_checkpoint`` check."""
    text = json.dumps(facts, indent=2, sort_keys=True)
    (directory / LAYOUT_FILE).write_text(text, encoding="utf-8")


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a ``ValueError`` naming the file when it holds anything else."""
    try:
        facts: object = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is damaged ({err}): evaluate, convert or resume another step") from None
    if not isinstance(facts, dict):
        raise ValueError(f"{path} is damaged (not a JSON object): evaluate, convert or resume another step")
    return cast(dict[str, Any], facts)


def read_layout(directory: Path) -> dict[str, Any]:
    """The facts of a folder written by ``save_checkpoint``; a clear error for anything else.

    A folder of the previous format (the backend's ``meta.json``, always with the training state)
    reads as format 1 with ``training_state`` true.
    """
    directory = Path(directory)
    path = directory / LAYOUT_FILE
    if path.is_file():
        facts = _json_object(path)
    else:
        legacy = directory / _LEGACY_META
        facts = _json_object(legacy) if legacy.is_file() else {}
        if facts.get("backend") == BACKEND and "tp_size" in facts:
            facts = {**facts, "format": 1, "training_state": True}
        else:
            facts = {}
    if facts.get("backend") != BACKEND:
        raise FileNotFoundError(
            f"{directory} is not a Megatron checkpoint (no {LAYOUT_FILE} written by the megatron backend's "
            "save_checkpoint); pass the folder a Megatron save_checkpoint wrote (a run's "
            "checkpoints/step_N)"
        )
    return facts


def layout_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, current)}`` for every :data:`LAYOUT_KEYS` entry that differs."""
    return {k: (saved.get(k), current[k]) for k in LAYOUT_KEYS if saved.get(k) != current[k]}


def copy_hf_meta(model_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in HF_META_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)


def convert_checkpoint(directory: str | Path, out_dir: str | Path) -> Path:
    """A folder written by ``MegatronTrainer.save_checkpoint`` → a Hugging Face safetensors folder.

    The checkpoint already holds one (``hf/``: config, tokenizer files and the model's safetensors,
    TP/PP/EP shards merged), so this copies it into ``out_dir`` (created if needed), in a plain
    process: no torch.distributed, no megatron-core. Works with or without the training state.

    Raises:
        FileNotFoundError: ``directory`` is not a Megatron checkpoint, or its ``hf/`` folder lacks
            ``config.json`` or the safetensors weights.
        ValueError: its ``layout.json`` (or ``meta.json``) is damaged.
    """
    src = Path(directory)
    read_layout(src)
    hf = src / HF_DIR
    has_weights = (hf / "model.safetensors").is_file() or (hf / "model.safetensors.index.json").is_file()
    if not (hf / "config.json").is_file() or not has_weights:
        raise FileNotFoundError(
            f"{hf} lacks config.json or model safetensors: the Megatron checkpoint {src} is incomplete "
            "(was its save interrupted?)"
        )
    out = Path(out_dir)
    if out.resolve() == hf.resolve():
        raise ValueError(f"{out} is the checkpoint's own hf/ folder; choose another output folder")
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(hf.iterdir()):
        if f.is_file():
            shutil.copy2(f, out / f.name)
    return out
