"""Expert parallelism on gloo: MoE models trained at EP=2 match a transformers reference (slow).

Two ranks, ``megatron_expert_parallel_size: 2`` (so data parallel 2 and expert data parallel 1):
each rank holds half of every MoE layer's experts and routes its own tokens to both ranks'
experts through megatron-core's ``alltoall`` dispatcher (on the CPU through ``_cpu_shim``). The
reference is the single-process transformers + AdamW run of ``test_training`` (same weights, same
samples, same loss and step token count). Routing has no capacity limit and no auxiliary loss
here, so the two compute the same function: loss and grad norm to 1e-5 relative, updated weights
to 1e-5 absolute (fp32; lr 1e-3).

The samples are chosen so that the two data-parallel ranks' packed micro-batches differ in length
(each rank sends a different number of tokens to the experts: what an all-gather dispatcher
cannot do) and one rank gets an empty padding micro-batch (``pack_samples(num_ranks=2)`` keeps
the counts equal); the test checks these properties itself. Qwen3-MoE covers the plain top-k
router; Qwen2-MoE adds the gated shared expert, which is replicated on every expert-parallel rank
and must still be reduced over data parallel; a third case runs Qwen2-MoE at EP 2 with pipeline
parallel 2 on four ranks. The exported weights must hold every expert of every layer.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from megatron_families import build_family
from megatron_spawn import run_ranks
from test_training import EPS, LR, WD, _check_against_reference, _reference, _samples

from telescope_algos import TrainingSample, pack_samples

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SEQ_LEN = 40
NUM_EXPERTS = 4  # megatron_families' MoE models
VOCAB = 200  # megatron_families' vocab


def _steps() -> list[list[dict]]:
    rng = random.Random(3)
    return [_samples(rng, 6, VOCAB), _samples(rng, 4, VOCAB)]


def test_the_samples_give_ranks_unequal_micro_batches():
    """The scenario the EP runs rely on: equal counts, unequal lengths, an empty padding micro-batch."""
    for i, step in enumerate(_steps()):
        samples = [TrainingSample(**s) for s in step]
        per_rank = pack_samples(samples, seq_len=SEQ_LEN, pad_to_multiple_of=8, num_ranks=2)
        assert len(per_rank[0]) == len(per_rank[1]) >= 1
        lengths = [[mb.input_ids.shape[1] for mb in mbs] for mbs in per_rank]
        assert lengths[0] != lengths[1], (i, lengths)
        if i == 0:
            assert len(per_rank[0]) == 2
            assert any(mb.num_tokens == 0 for mbs in per_rank for mb in mbs)


@pytest.mark.parametrize(
    ("family", "world", "pp"), [("qwen3_moe", 2, 1), ("qwen2_moe", 2, 1), ("qwen2_moe", 4, 2)]
)
def test_expert_parallel_matches_reference(tmp_path: Path, family: str, world: int, pp: int):
    model_dir = build_family(family, tmp_path / "models")
    steps = _steps()
    spec = {
        "model_dir": str(model_dir),
        "seq_len": SEQ_LEN,
        "steps": steps,
        "overrides": {
            "learning_rate": LR,
            "weight_decay": WD,
            "megatron_expert_parallel_size": 2,
            "megatron_pipeline_parallel_size": pp,
            "mixed_precision_dtype": None,
        },
        "options": {"adam_beta2": 0.999, "adam_eps": EPS},
        "mismatched_counts": pp == 1,
    }
    result = run_ranks(spec, world, tmp_path, timeout=900)
    assert result["dp_world_size"] == 2
    if pp == 1:  # rank 0 holds MoE layers; with PP 2 it may hold only the first stage's
        assert result["local_experts"] == [0, 1]  # half of the experts, numbered from 0 on the rank
    assert result["is_broadcast_rank"] is True
    for got in result["steps"]:
        per_layer: dict[str, set[int]] = {}
        for name in got["weights"]:
            if ".experts." in name:
                layer, rest = name.split(".experts.")
                per_layer.setdefault(layer, set()).add(int(rest.split(".")[0]))
        assert len(per_layer) == 2  # both layers are MoE layers
        assert all(ids == set(range(NUM_EXPERTS)) for ids in per_layer.values()), per_layer
    _check_against_reference(result, _reference(model_dir, steps))
    if pp == 1:
        error = result["mismatch_error"]
        assert error is not None
        assert "different numbers of micro-batches (1 to 2" in error
        assert "num_ranks=2" in error
