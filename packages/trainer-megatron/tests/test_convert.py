"""Hugging Face ⇄ Megatron conversion: hand-worked layouts and exact round trips for every family."""

from __future__ import annotations

import pytest
import torch
from megatron_families import FAMILIES, family_config

from telescope_trainer_megatron import Architecture, hf_to_megatron, megatron_to_hf, padded_vocab_size
from telescope_trainer_megatron._convert import hf_sources


def _arch(**kw) -> Architecture:
    base = dict(
        model_type="llama",
        vocab_size=5,
        hidden_size=2,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=1,
        ffn_hidden_size=2,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        max_position_embeddings=8,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        moe_layers=(False,),
    )
    return Architecture(**{**base, **kw})


def test_padded_vocab_is_a_multiple_of_lcm_64_tp():
    assert padded_vocab_size(437, 1) == 448  # 7 * 64
    assert padded_vocab_size(448, 1) == 448
    assert padded_vocab_size(100, 3) == 192  # lcm(64, 3) = 192


def test_qkv_interleaves_query_groups_by_hand():
    # 4 query heads, 2 kv groups, head_dim 1, hidden 1: rows are the head index.
    arch = _arch(hidden_size=1)
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])  # heads q0..q3; group 0 = q0,q1; group 1 = q2,q3
    k = torch.tensor([[10.0], [11.0]])
    v = torch.tensor([[20.0], [21.0]])
    state = {
        "model.embed_tokens.weight": torch.zeros(5, 1),
        "model.layers.0.input_layernorm.weight": torch.ones(1),
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.layers.0.self_attn.o_proj.weight": torch.zeros(1, 4),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(1),
        "model.layers.0.mlp.gate_proj.weight": torch.tensor([[1.0], [2.0]]),
        "model.layers.0.mlp.up_proj.weight": torch.tensor([[3.0], [4.0]]),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(1, 2),
        "model.norm.weight": torch.ones(1),
        "lm_head.weight": torch.arange(5.0)[:, None],
    }
    m = hf_to_megatron(state, arch, padded_vocab=8)
    # group 0: q0 q1 k0 v0, group 1: q2 q3 k1 v1
    expected = [0.0, 1.0, 10.0, 20.0, 2.0, 3.0, 11.0, 21.0]
    assert m["decoder.layers.0.self_attention.linear_qkv.weight"].flatten().tolist() == expected
    assert m["decoder.layers.0.mlp.linear_fc1.weight"].flatten().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert m["output_layer.weight"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0]
    back = dict(megatron_to_hf(m, arch))
    assert set(back) == set(state)
    for name, t in state.items():
        assert torch.equal(back[name], t), name


def test_unknown_weights_are_refused():
    arch = _arch()
    with pytest.raises(KeyError, match="lack"):
        hf_to_megatron({}, arch, padded_vocab=64)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_is_exact_for_every_family(family: str, tied: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = family_config(family, tied=tied)
    model = AutoModelForCausalLM.from_config(config)
    # The checkpoint (on-disk) names: what save_pretrained writes and vLLM loads.
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        hf_state = load_file(f"{d}/model.safetensors")
    arch = Architecture.from_dict(config.to_dict())
    m_state = hf_to_megatron(hf_state, arch, padded_vocab_size(arch.vocab_size, 2))
    assert m_state["embedding.word_embeddings.weight"].shape[0] == 256
    back = dict(megatron_to_hf(m_state, arch))
    assert set(back) == set(hf_state) - ({"lm_head.weight"} if tied else set())
    for name, tensor in back.items():
        assert torch.equal(tensor, hf_state[name]), name
    # every Megatron tensor names its sources, and sources are real checkpoint names
    assert all(s in hf_state for n in m_state for s in hf_sources(n, arch))


def test_architecture_reads_moe_routing_and_refuses_rope_scaling():
    mixtral = Architecture.from_dict(family_config("mixtral").to_dict())
    assert (mixtral.num_experts, mixtral.moe_topk, mixtral.moe_pre_softmax) == (4, 2, False)
    q2 = Architecture.from_dict(family_config("qwen2_moe").to_dict())
    assert q2.moe_pre_softmax
    assert q2.shared_expert_gate
    assert q2.qkv_bias
    q3 = Architecture.from_dict(family_config("qwen3").to_dict())
    assert q3.qk_norm
    assert not q3.qkv_bias
    cfg = family_config("llama").to_dict()
    cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}
    with pytest.raises(ValueError, match="rope"):
        Architecture.from_dict(cfg)
    with pytest.raises(ValueError, match="not supported"):
        Architecture.from_dict({"model_type": "gpt2"})
