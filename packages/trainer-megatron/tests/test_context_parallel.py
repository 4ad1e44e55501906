"""Context parallelism trains exactly like CP = 1 (slow, CPU, gloo; 1, 2 and 4 processes).

The same tiny Llama (4 heads, 2 KV heads, hidden 128), the same packed steps and config, float32
throughout; CP = 2 (alone, with TP = 2, with PP = 2, with DP = 2) against the run without CP. The
micro-batches come from ``pack_samples`` with ``pad_to_multiple_of`` 5, so rows are not multiples of
2·CP and the trainer pads them; several samples straddle a chunk boundary (both are asserted).

* ``grpo`` with ``use_ppo_clip`` against the recomputed pre-update policy
  (``ppo_clip_ref_logprobs: batch``: the no-grad pass runs under CP too), two minibatches (two
  optimizer steps per train step, so the second one has ratios ≠ 1) and an entropy bonus (the
  entropy's gradient crosses the CP all-gather).
* ``gspo`` against the rollout log-probabilities, which sit near the model's so that some sequence
  ratios are clipped and some are not: the sequence-level ratio needs every token of a sample,
  spread over both CP ranks.

Tolerances as in ``test_vs_fsdp.py``: loss, grad norm and every metric within 1e-5 relative (and
1e-7 absolute for fractions that are 0); every updated weight within 1e-5 absolute (1% of one
lr-sized step). Differences come only from fp32 summation order (measured ≈ 2e-7).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch
from megatron_spawn import run_ranks
from safetensors.torch import load_file

from telescope_algos import TrainingSample, pack_samples
from telescope_algos.backend import chunk_bounds, split_length

SEQ_LEN, PAD = 50, 5
BASE = {
    "learning_rate": 1e-3,
    "weight_decay": 0.1,
    "grad_clip": 0.5,
    "lr_scheduler": "none",
    "model_dtype": "float32",
    "mixed_precision_dtype": None,
}
PPO = {
    **BASE,
    "algorithm": "grpo",
    "use_ppo_clip": True,
    "ppo_clip_ref_logprobs": "batch",
    "number_of_minibatches": 2,
    "entropy_coef": 0.01,
}
GSPO = {**BASE, "algorithm": "gspo", "ppo_clip_ref_logprobs": "rollout"}
OPTIONS = {"adam_beta2": 0.999, "adam_eps": 1e-4}

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _steps(seed: int, rollout_center: float | None) -> list[list[dict]]:
    """Two steps of 7 and 6 samples (11-24 tokens); rollout log-probs random in [-7, -3], or near
    ``rollout_center`` with a per-sample offset (so GSPO's sequence ratios spread around 1)."""
    rng = random.Random(seed)
    steps = []
    for n in (7, 6):
        samples = []
        for _ in range(n):
            prompt = [rng.randrange(3, 400) for _ in range(rng.randint(3, 8))]
            completion = [rng.randrange(3, 400) for _ in range(rng.randint(8, 16))]
            if rollout_center is None:
                rollout = [-rng.uniform(3, 7) for _ in completion]
            else:
                offset = rng.uniform(-0.8, 0.8)
                rollout = [rollout_center + offset + rng.uniform(-0.3, 0.3) for _ in completion]
            samples.append(
                {
                    "prompt_ids": prompt,
                    "completion_ids": completion,
                    "advantage": rng.uniform(-2, 2),
                    "rollout_logprobs": rollout,
                }
            )
        steps.append(samples)
    return steps


def _check_layout(steps: list[list[dict]], dp: int) -> None:
    """The test covers what it claims: padded rows and samples cut by the CP=2 chunk boundaries."""
    padded = straddling = 0
    for samples in steps:
        for rank in pack_samples(
            [TrainingSample(**s) for s in samples], seq_len=SEQ_LEN, pad_to_multiple_of=PAD, num_ranks=dp
        ):
            for mb in rank:
                length = mb.input_ids.shape[1]
                padded += split_length(length, 2) != length
                cuts = {s for r in range(2) for s, _ in chunk_bounds(split_length(length, 2), 2, r)}
                starts = [*torch.nonzero(mb.position_ids[0] == 0).squeeze(1).tolist(), length]
                for s, e in itertools.pairwise(starts):
                    straddling += mb.loss_mask[0, s:e].any().item() and any(s < c < e for c in cuts)
    assert padded > 0, "some row must need the trainer's padding to a multiple of 2·CP"
    assert straddling > 2, "several trained samples must straddle a CP chunk boundary"


def _run(
    model: Path,
    steps: list,
    tmp: Path,
    overrides: dict,
    *,
    world: int,
    checkpoint: bool = False,
    **sizes: int,
) -> dict:
    spec = {
        "checkpoint": checkpoint,
        "model_dir": str(model),
        "seq_len": SEQ_LEN,
        "pad": PAD,
        "steps": steps,
        "overrides": {
            **overrides,
            "trainer_num_workers": world,
            "megatron_tensor_parallel_size": sizes.get("tp", 1),
            "megatron_pipeline_parallel_size": sizes.get("pp", 1),
            "megatron_context_parallel_size": sizes.get("cp", 1),
        },
        "options": OPTIONS,
    }
    tmp.mkdir(parents=True, exist_ok=True)
    result = run_ranks(spec, world, tmp, timeout=900)
    assert result["dp_world_size"] == world // (sizes.get("tp", 1) * sizes.get("pp", 1) * sizes.get("cp", 1))
    return result


def _assert_same(got: list[dict], ref: list[dict], initial: dict[str, torch.Tensor]) -> None:
    for step, (g, r) in enumerate(zip(got, ref, strict=True)):
        m, rm = g["metrics"], r["metrics"]
        assert set(m) == set(rm), step
        assert m["skipped_steps"] == rm["skipped_steps"] == 0
        for key, value in rm.items():
            if not key.startswith("timing/"):
                assert m[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
        for name, tensor in g["weights"].items():
            diff = (tensor - r["weights"][name]).abs().max().item()
            assert diff < 1e-5, (step, name, diff)
    # The comparison means something: every weight matrix moved by far more than the tolerance.
    for name, tensor in initial.items():
        if tensor.dim() > 1:
            assert (got[-1]["weights"][name] - tensor).abs().max().item() > 1e-4, name


@pytest.fixture(scope="module")
def ppo_steps() -> list[list[dict]]:
    steps = _steps(1234, None)
    _check_layout(steps, dp=1)
    return steps


@pytest.fixture(scope="module")
def ppo_reference(
    tiny_tp_model: Path, ppo_steps: list, tmp_path_factory: pytest.TempPathFactory
) -> list[dict]:
    ref = _run(tiny_tp_model, ppo_steps, tmp_path_factory.mktemp("cp1"), PPO, world=1)["steps"]
    m = ref[0]["metrics"]
    assert m["grad_norm"] > BASE["grad_clip"], "clipping should be active"
    assert m["entropy_bonus"] > 0
    return ref


def test_cp2_matches_cp1(tiny_tp_model: Path, ppo_steps: list, ppo_reference: list, tmp_path: Path):
    result = _run(tiny_tp_model, ppo_steps, tmp_path, PPO, world=2, cp=2, checkpoint=True)
    _assert_same(result["steps"], ppo_reference, load_file(tiny_tp_model / "model.safetensors"))
    # Checkpoint round trip under CP: a trainer resumed after step 0 repeats step 1 bit for bit.
    resumed, original = result["resumed"][0], result["steps"][1]
    assert resumed["metrics"]["loss"] == original["metrics"]["loss"]
    for name, tensor in original["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name


@pytest.mark.parametrize("sizes", [{"tp": 2}, {"pp": 2}], ids=["tp2", "pp2"])
def test_cp2_with_tensor_or_pipeline_parallel_matches_cp1(
    tiny_tp_model: Path, ppo_steps: list, ppo_reference: list, tmp_path: Path, sizes: dict
):
    got = _run(tiny_tp_model, ppo_steps, tmp_path, PPO, world=4, cp=2, **sizes)["steps"]
    _assert_same(got, ppo_reference, load_file(tiny_tp_model / "model.safetensors"))


def test_cp2_with_data_parallel_matches_dp2_alone(tiny_tp_model: Path, tmp_path: Path):
    # DP = 2 packs the step into two shards: compare with DP = 2 without CP (same packing).
    steps = _steps(99, None)
    _check_layout(steps, dp=2)
    ref = _run(tiny_tp_model, steps, tmp_path / "dp2", PPO, world=2)["steps"]
    got = _run(tiny_tp_model, steps, tmp_path / "dp2cp2", PPO, world=4, cp=2)["steps"]
    _assert_same(got, ref, load_file(tiny_tp_model / "model.safetensors"))


def test_gspo_cp2_matches_cp1(tiny_tp_model: Path, tmp_path: Path):
    steps = _steps(7, -6.3)
    _check_layout(steps, dp=1)
    ref = _run(tiny_tp_model, steps, tmp_path / "cp1", GSPO, world=1)["steps"]
    for r in ref:
        clipped = r["metrics"]["clip_low_frac"] + r["metrics"]["clip_high_frac"]
        assert 0 < clipped < 1, "some sequence ratios clipped, some not"
    got = _run(tiny_tp_model, steps, tmp_path / "cp2", GSPO, world=2, cp=2)["steps"]
    _assert_same(got, ref, load_file(tiny_tp_model / "model.safetensors"))
