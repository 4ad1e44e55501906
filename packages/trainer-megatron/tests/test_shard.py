"""Tensor-parallel split and merge rules, and pipeline/expert index mapping, by hand."""

from __future__ import annotations

import torch

from telescope_trainer_megatron import tp_merge, tp_shard
from telescope_trainer_megatron._shard import to_global_name, to_local_name, tp_split_dim


def test_split_dims():
    assert tp_split_dim("embedding.word_embeddings.weight") == 0
    assert tp_split_dim("decoder.layers.3.self_attention.linear_qkv.bias") == 0
    assert tp_split_dim("decoder.layers.3.self_attention.linear_proj.weight") == 1
    assert tp_split_dim("decoder.layers.3.mlp.linear_fc1.weight") == "gated"
    assert tp_split_dim("decoder.layers.3.mlp.linear_fc2.weight") == 1
    assert tp_split_dim("decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.weight") is None
    assert tp_split_dim("decoder.layers.3.input_layernorm.weight") is None


def test_gated_fc1_keeps_gate_and_up_halves_per_rank():
    # [gate rows g0..g3; up rows u0..u3] -> rank 0 [g0 g1 u0 u1], rank 1 [g2 g3 u2 u3]
    full = torch.arange(8.0)[:, None]
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    assert tp_shard(name, full, 0, 2).flatten().tolist() == [0.0, 1.0, 4.0, 5.0]
    assert tp_shard(name, full, 1, 2).flatten().tolist() == [2.0, 3.0, 6.0, 7.0]
    assert torch.equal(tp_merge(name, [tp_shard(name, full, r, 2) for r in range(2)]), full)


def test_row_parallel_round_trip():
    full = torch.arange(12.0).view(2, 6)
    name = "decoder.layers.0.self_attention.linear_proj.weight"
    shards = [tp_shard(name, full, r, 3) for r in range(3)]
    assert shards[1].tolist() == [[2.0, 3.0], [8.0, 9.0]]
    assert torch.equal(tp_merge(name, shards), full)


def test_pipeline_and_expert_offsets():
    local = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"
    glob = to_global_name(local, layer_offset=2, expert_offset=4)
    assert glob == "decoder.layers.3.mlp.experts.local_experts.4.linear_fc2.weight"
    assert to_local_name(glob, layer_offset=2, num_layers=2, expert_offset=4, num_experts=2) == local
    assert to_local_name(glob, layer_offset=0, num_layers=2, expert_offset=4, num_experts=2) is None
    assert to_local_name(glob, layer_offset=2, num_layers=2, expert_offset=0, num_experts=2) is None
    assert to_local_name("output_layer.weight", layer_offset=2, num_layers=2) == "output_layer.weight"
