"""What a Hugging Face ``config.json`` says about the model, in the terms Megatron needs.

:class:`Architecture` is read from the plain config dictionary (no transformers import) for the
families this backend supports: Llama (and Mistral without sliding windows), Qwen2 (QKV bias),
Qwen3 (QK norm), and the mixture-of-experts families Qwen2-MoE (shared expert with a sigmoid
gate), Qwen3-MoE and Mixtral. Anything the Megatron model could not reproduce exactly (rope
scaling, sliding windows, biases on other projections) is refused with a message instead of
being trained silently wrong.

Routing: Hugging Face takes a softmax over all experts, keeps the top k, and renormalises them
when ``norm_topk_prob`` is true (always for Mixtral). Megatron's ``moe_router_pre_softmax=False``
(top k of the logits, then a softmax over those k) equals the renormalised form;
``pre_softmax=True`` (softmax, then top k) equals the plain form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SUPPORTED_MODEL_TYPES", "Architecture", "padded_vocab_size"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
_MOE_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")


def padded_vocab_size(vocab_size: int, tensor_parallel_size: int, multiple: int = 64) -> int:
    """Smallest size ≥ ``vocab_size`` divisible by ``lcm(multiple, tensor_parallel_size)``.

    Megatron splits the embedding rows evenly over the tensor-parallel ranks, so the vocabulary is
    padded with rows that no token id uses, up to a multiple of lcm(64, TP).
    """
    step = math.lcm(multiple, tensor_parallel_size)
    return -(-vocab_size // step) * step


@dataclass(frozen=True)
class Architecture:
    """The facts of one Hugging Face decoder model that shape its Megatron twin."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    num_experts: int | None = None
    moe_topk: int = 0
    moe_ffn_hidden_size: int | None = None
    moe_pre_softmax: bool = False
    shared_expert_size: int | None = None
    shared_expert_gate: bool = False
    moe_layers: tuple[bool, ...] = field(default_factory=tuple)
    """Per layer: True where the MLP is a mixture of experts (all False for dense models)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def mlp_prefix(self) -> str:
        """Hugging Face module name of a MoE block inside a layer (Mixtral's differs)."""
        return "block_sparse_moe" if self.model_type == "mixtral" else "mlp"

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> Architecture:
        """Read ``config.json`` from a local model folder."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: the Megatron backend needs a local Hugging Face model folder "
                "(download it first, e.g. with `hf download`)"
            )
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> Architecture:
        """Build from a Hugging Face config dictionary (``config.json`` or ``PretrainedConfig.to_dict()``)."""
        model_type = str(cfg.get("model_type", "")).lower()
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported by the Megatron backend; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (use train_backend: fsdp for other models)"
            )
        _refuse_unsupported(cfg, model_type)
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope: dict[str, Any] = cfg.get("rope_parameters") or {}
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta") or 10000.0))
        layers = int(cfg["num_hidden_layers"])
        if model_type in ("qwen2", "qwen2_moe"):
            qkv_bias = bool(cfg.get("qkv_bias", True)) if model_type == "qwen2_moe" else True
        else:
            qkv_bias = bool(cfg.get("attention_bias", False))
        kwargs: dict[str, Any] = {}
        if model_type in _MOE_TYPES:
            experts = cfg.get("num_experts") or cfg.get("num_local_experts")
            if not experts:
                raise ValueError(f"{model_type} config has neither num_experts nor num_local_experts")
            sparse_step = int(cfg.get("decoder_sparse_step") or 1)
            dense_layers = set(cfg.get("mlp_only_layers") or [])
            norm_topk = True if model_type == "mixtral" else bool(cfg.get("norm_topk_prob", False))
            shared = cfg.get("shared_expert_intermediate_size") if model_type == "qwen2_moe" else None
            kwargs = {
                "num_experts": int(experts),
                "moe_topk": int(cfg.get("num_experts_per_tok", 2)),
                "moe_ffn_hidden_size": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
                "moe_pre_softmax": not norm_topk,
                "shared_expert_size": int(shared) if shared else None,
                "shared_expert_gate": bool(shared),
                "moe_layers": tuple(
                    i not in dense_layers and (i + 1) % sparse_step == 0 for i in range(layers)
                ),
            }
        else:
            kwargs["moe_layers"] = (False,) * layers
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            ffn_hidden_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            **kwargs,
        )


def _refuse_unsupported(cfg: dict[str, Any], model_type: str) -> None:
    rope: dict[str, Any] = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(
            f"rope_type {rope_type!r} (rope scaling) is not supported by the Megatron backend yet; "
            "use train_backend: fsdp for this model"
        )
    if cfg.get("use_sliding_window") or (model_type == "mistral" and cfg.get("sliding_window")):
        raise ValueError(
            "sliding-window attention is not supported by the Megatron backend; "
            "use train_backend: fsdp or a config with use_sliding_window: false"
        )
    if cfg.get("mlp_bias"):
        raise ValueError("MLP biases (mlp_bias: true) are not supported by the Megatron backend")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg.get('hidden_act')!r} is not supported; Megatron uses SiLU-GLU")
