"""Hugging Face ⇄ Megatron weight names and layouts, one tensor at a time, exact both ways.

Megatron names here are *global*: the whole (tensor-parallel merged) tensor, the global layer
index and the global expert index, as a single-rank GPTModel built with the local layer spec
would name them. :mod:`telescope_trainer_megatron._shard` maps them to and from one rank's shard.
Hugging Face names are the checkpoint (``*.safetensors``) names that vLLM loads, e.g.
``model.layers.0.mlp.experts.3.gate_proj.weight`` (Mixtral: ``block_sparse_moe.experts.3.w1``).

Layouts that are not a rename:

* ``linear_qkv``: Megatron stores, for each of the ``g`` key/value groups, that group's
  ``h/g`` query heads, then its key head, then its value head:
  ``[g, h/g + 2, d, hidden]`` flattened to rows. Hugging Face has separate q, k, v projections.
* ``linear_fc1`` (SwiGLU): ``[gate; up]`` stacked on rows = ``gate_proj`` then ``up_proj``.
* Embedding and output rows are padded to the padded vocabulary with zero rows; the padding is
  dropped on the way back.

Every function moves data with ``cat``/``view``/slicing only, so a round trip is bit-exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch

from telescope_trainer_megatron._arch import Architecture

__all__ = ["hf_sources", "hf_to_megatron", "megatron_names", "megatron_tensor_to_hf", "megatron_to_hf"]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")

# Megatron per-layer suffix -> Hugging Face per-layer suffix, for the plain renames.
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_expert.down_proj.weight",
    "mlp.shared_experts.gate_weight": "mlp.shared_expert_gate.weight",
}


def _expert_names(arch: Architecture, e: int) -> tuple[str, str, str]:
    """HF (gate, up, down) per-layer suffixes of expert ``e``."""
    if arch.model_type == "mixtral":
        base = f"block_sparse_moe.experts.{e}"
        return f"{base}.w1.weight", f"{base}.w3.weight", f"{base}.w2.weight"
    base = f"mlp.experts.{e}"
    return f"{base}.gate_proj.weight", f"{base}.up_proj.weight", f"{base}.down_proj.weight"


def megatron_names(arch: Architecture) -> list[str]:
    """Every global Megatron parameter name of the model, in model order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        p = f"decoder.layers.{i}."
        names.append(p + "input_layernorm.weight")
        names.append(p + "self_attention.linear_qkv.weight")
        if arch.qkv_bias:
            names.append(p + "self_attention.linear_qkv.bias")
        if arch.qk_norm:
            names += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"]
        names.append(p + "self_attention.linear_proj.weight")
        names.append(p + "pre_mlp_layernorm.weight")
        if arch.moe_layers[i]:
            names.append(p + "mlp.router.weight")
            for e in range(arch.num_experts or 0):
                names += [p + f"mlp.experts.local_experts.{e}.linear_fc1.weight"]
                names += [p + f"mlp.experts.local_experts.{e}.linear_fc2.weight"]
            if arch.shared_expert_size:
                names += [
                    p + "mlp.shared_experts.linear_fc1.weight",
                    p + "mlp.shared_experts.linear_fc2.weight",
                ]
                if arch.shared_expert_gate:
                    names.append(p + "mlp.shared_experts.gate_weight")
        else:
            names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


_TOP_LEVEL = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
}
# Megatron per-layer suffix -> the Hugging Face tensors stacked into it, in order.
_STACKED = {
    "self_attention.linear_qkv.weight": tuple(f"self_attn.{x}_proj.weight" for x in "qkv"),
    "self_attention.linear_qkv.bias": tuple(f"self_attn.{x}_proj.bias" for x in "qkv"),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.shared_experts.linear_fc1.weight": (
        "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight",
    ),
}


def hf_sources(name: str, arch: Architecture) -> list[str]:
    """The Hugging Face tensors a global Megatron tensor is built from (1 to 3 names)."""
    if name == "output_layer.weight":
        return ["model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"]
    if name in _TOP_LEVEL:
        return [_TOP_LEVEL[name]]
    m = _LAYER.match(name)
    sources = None if m is None else _layer_sources(m.group(2), arch)
    if m is None or sources is None:
        raise KeyError(f"unknown Megatron parameter {name!r}")
    return [f"model.layers.{m.group(1)}.{s}" for s in sources]


def _layer_sources(rest: str, arch: Architecture) -> list[str] | None:
    """The per-layer Hugging Face suffixes of the per-layer Megatron suffix ``rest`` (None: unknown)."""
    if rest in _LAYER_RENAMES:
        return [_LAYER_RENAMES[rest]]
    if rest in _STACKED:
        return list(_STACKED[rest])
    if rest == "mlp.router.weight":
        return [f"{arch.mlp_prefix}.gate.weight"]
    em = _EXPERT.match(rest)
    if em is None:
        return None
    gate, up, down = _expert_names(arch, int(em.group(1)))
    return [gate, up] if em.group(2) == "linear_fc1" else [down]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] > rows:
        raise ValueError(f"vocabulary of {t.shape[0]} rows does not fit the padded size {rows}")
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if t.shape[0] < rows else t


def _qkv_to_megatron(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Architecture) -> torch.Tensor:
    g, d = arch.num_kv_heads, arch.head_dim
    tail = q.shape[1:]
    parts = (q.reshape(g, -1, d, *tail), k.reshape(g, 1, d, *tail), v.reshape(g, 1, d, *tail))
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def _qkv_to_hf(qkv: torch.Tensor, arch: Architecture) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d = arch.num_kv_heads, arch.head_dim
    per = arch.num_heads // g
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, per + 2, d, *tail)
    q = grouped[:, :per].reshape(-1, *tail)
    k = grouped[:, per].reshape(-1, *tail)
    v = grouped[:, per + 1].reshape(-1, *tail)
    return q, k, v


def hf_to_megatron_tensor(
    name: str, sources: list[torch.Tensor], arch: Architecture, padded_vocab: int
) -> torch.Tensor:
    """Build one global Megatron tensor from its :func:`hf_sources` tensors (same order)."""
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return _pad_rows(sources[0], padded_vocab)
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        q, k, v = sources
        return _qkv_to_megatron(q, k, v, arch)
    if len(sources) == 2:  # gate and up of a SwiGLU fc1
        return torch.cat(sources, dim=0)
    return sources[0]


def megatron_tensor_to_hf(
    name: str, tensor: torch.Tensor, arch: Architecture
) -> list[tuple[str, torch.Tensor]]:
    """One global Megatron tensor as its Hugging Face tensors; ``[]`` for a tied output layer."""
    if name == "output_layer.weight" and arch.tie_word_embeddings:
        return []
    targets = hf_sources(name, arch)
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return [(targets[0], tensor[: arch.vocab_size])]
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        return list(zip(targets, _qkv_to_hf(tensor, arch), strict=True))
    if len(targets) == 2:
        return list(zip(targets, tensor.chunk(2, dim=0), strict=True))
    return [(targets[0], tensor)]


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor], arch: Architecture, padded_vocab: int
) -> dict[str, torch.Tensor]:
    """A whole Hugging Face state dict as global Megatron tensors; every HF tensor must be used."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name in megatron_names(arch):
        src = hf_sources(name, arch)
        missing = [s for s in src if s not in hf_state]
        if missing:
            raise KeyError(f"Hugging Face weights lack {missing} (needed for {name})")
        used.update(src)
        out[name] = hf_to_megatron_tensor(name, [hf_state[s] for s in src], arch, padded_vocab)
    ignored: set[str] = {"lm_head.weight"} if arch.tie_word_embeddings else set()
    unused = sorted(set(hf_state) - used - ignored)
    if unused:
        raise KeyError(f"Hugging Face weights the {arch.model_type} mapping does not know: {unused[:8]}")
    return out


def megatron_to_hf(
    m_state: Mapping[str, torch.Tensor], arch: Architecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Global Megatron tensors as Hugging Face ``(name, tensor)`` pairs, in the order given."""
    for name, tensor in m_state.items():
        yield from megatron_tensor_to_hf(name, tensor, arch)
