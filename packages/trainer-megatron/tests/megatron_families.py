"""Tiny random Hugging Face models of every family the backend supports (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")


def family_config(name: str, *, tied: bool = False):
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    moe: dict[str, Any] = dict(num_experts_per_tok=2, moe_intermediate_size=48)
    if name == "llama":
        return tf.LlamaConfig(**common, head_dim=16)
    if name == "qwen2":
        return tf.Qwen2Config(**common)
    if name == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16)
    if name == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **common, **moe, num_experts=4, shared_expert_intermediate_size=80, norm_topk_prob=False
        )
    if name == "qwen3_moe":
        # head_dim is not a declared field of Qwen3MoeConfig; it is kept as an extra attribute.
        return tf.Qwen3MoeConfig(
            **common,
            **moe,
            num_experts=4,
            head_dim=16,  # pyright: ignore[reportCallIssue]
            norm_topk_prob=True,
        )
    if name == "mixtral":
        common["intermediate_size"] = 48
        return tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(name)


def build_family(name: str, root: Path, *, tied: bool = False, seed: int = 0) -> Path:
    """Save a random tiny ``name`` model (fp32 safetensors) under ``root/name``; return the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name, tied=tied))
    with torch.no_grad():  # give norms and biases non-trivial values so the mapping is really tested
        for _n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    out = root / (name + ("_tied" if tied else ""))
    model.save_pretrained(out)
    return out
