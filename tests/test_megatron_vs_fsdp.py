"""The Megatron backend (TP=1, TP=2, DP=2) trains exactly like the FSDP backend (slow, CPU, gloo).
Both backends: a root test (neither package depends on the other).

Both backends get the same tiny Llama folder (4 heads, 2 KV heads, so TP=2 splits it), the same
packed micro-batches from ``telescope_algos.pack_samples`` (mixed lengths, several samples per row,
random advantages and rollout log-probabilities) and the same config: float32 parameters and no
mixed precision (``model_dtype: float32``, ``mixed_precision_dtype: null``), ``learning_rate``
1e-3, ``weight_decay`` 0.1, ``grad_clip`` 0.5, no LR schedule. Two ``train_step`` calls each; the
FSDP trainer runs in this process on one gloo rank, Megatron runs in spawned ranks (1 for TP=1,
2 for TP=2 or DP=2) through ``megatron_worker.py``.

Two losses: GRPO's token mean (TP=1, TP=2; the same micro-batches on both sides) and Dr. GRPO's
``token_sum_norm`` (masked sum / (samples · max_tokens)), where Megatron runs DP=2 with several
micro-batches per rank (one of them an empty padding micro-batch) and FSDP runs one micro-batch
holding every sample: each Megatron micro-batch must divide by the *group's* sample count over
all ranks, not its own.

Adam is made identical on both sides. Both use betas 0.9/0.999 by default (FSDP:
``torch.optim.AdamW``'s defaults on one parameter group; Megatron: the same defaults), but
Megatron never decays 1-D parameters (norms, biases), a documented difference. The Megatron side
gets ``adam_eps=1e-4`` and keeps its default betas; the FSDP trainer exposes no optimizer options,
so this test rebuilds its AdamW with the same hyper-parameters and Megatron's grouping (decay on
matrices only). eps is 1e-4 rather than 1e-8 so that an update is smooth in the
gradient: with eps 1e-8 Adam's first step is lr·sign(g), and fp32 summation-order noise of 1e-9
in a near-zero gradient flips a whole lr-sized step.

Tolerances: ``loss`` and ``grad_norm`` within 1e-5 relative; every updated weight (Hugging Face
names, from ``hf_weights()``) within 1e-5 absolute, i.e. 1% of one lr-sized step, while a missed
clip, a wrong decay or a mis-scaled gradient moves weights by 1e-4 or more. Differences come only
from fp32 summation order (different attention kernels, TP all-reduces).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import telescope_config
from telescope_algos import TrainingSample, pack_samples
from telescope_algos.testing import run_ranks

MEGATRON_WORKER = (
    Path(__file__).resolve().parents[1] / "packages" / "trainer-megatron" / "tests" / "megatron_worker.py"
)

SEQ_LEN, PAD = 48, 8
LR, WD, EPS, BETAS, CLIP = 1e-3, 0.1, 1e-4, (0.9, 0.999), 0.5
SHARED = {
    "learning_rate": LR,
    "weight_decay": WD,
    "grad_clip": CLIP,
    "lr_scheduler": "none",
    "model_dtype": "float32",
    "mixed_precision_dtype": None,
    "temperature": 1.0,
}

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _steps() -> list[list[dict]]:
    """Two steps of samples, 11-24 tokens each, so a 48-token row holds two to four of them."""
    rng = random.Random(1234)
    steps = []
    for n in (7, 6):
        samples = []
        for _ in range(n):
            prompt = [rng.randrange(3, 400) for _ in range(rng.randint(3, 8))]
            completion = [rng.randrange(3, 400) for _ in range(rng.randint(8, 16))]
            samples.append(
                {
                    "prompt_ids": prompt,
                    "completion_ids": completion,
                    "advantage": rng.uniform(-2, 2),
                    "rollout_logprobs": [-rng.uniform(3, 7) for _ in completion],
                }
            )
        steps.append(samples)
    return steps


DR_GRPO = {**SHARED, "algorithm": "dr_grpo", "dr_grpo_loss_agg_mode": "token_sum_norm", "max_tokens": 16}
ONE_ROW = 256  # every sample of a step fits one micro-batch


def _fsdp_run(
    model_dir: Path, steps: list[list[dict]], *, overrides: dict = SHARED, seq_len: int = SEQ_LEN
) -> list[dict]:
    from telescope_trainer_fsdp import create_trainer

    values = {
        **telescope_config.defaults(),
        "environments": [{"name": "countdown"}],
        "model": str(model_dir),
        "train_backend": "fsdp",
        "trainer_num_workers": 1,
        **overrides,
    }
    config = telescope_config.TelescopeConfig.model_validate(values)
    trainer = create_trainer(config, seed=0)
    try:
        params = trainer._params
        # Megatron's Adam: decoupled decay on matrices only, the same betas and eps (module docstring).
        trainer.optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.dim() > 1], "weight_decay": WD},
                {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0},
            ],
            lr=LR,
            betas=BETAS,
            eps=EPS,
        )
        out = []
        for i, samples in enumerate(steps):
            [micro_batches] = pack_samples(
                [TrainingSample(**s) for s in samples], seq_len=seq_len, pad_to_multiple_of=PAD, num_ranks=1
            )
            assert len(micro_batches) < len(samples), "the test wants several samples per row"
            assert seq_len != ONE_ROW or len(micro_batches) == 1
            metrics = trainer.train_step(micro_batches, step=i)
            weights = {n: t.detach().cpu().clone() for n, t in trainer.hf_weights()}
            out.append({"metrics": metrics, "weights": weights})
        return out
    finally:
        trainer.close()


def _megatron_run(
    model_dir: Path, steps: list[list[dict]], tmp: Path, *, tp: int, dp: int = 1, overrides: dict = SHARED
) -> list[dict]:
    world = tp * dp
    spec = {
        "model_dir": str(model_dir),
        "seq_len": SEQ_LEN,
        "pad": PAD,
        "steps": steps,
        "overrides": {**overrides, "trainer_num_workers": world, "megatron_tensor_parallel_size": tp},
        "options": {"adam_eps": EPS},  # betas: Megatron's defaults, which are FSDP's (module docstring)
    }
    spec["out"] = str(tmp / "result.pt")
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {"TMPDIR": str(tmp)}
    run_ranks(MEGATRON_WORKER, [str(tmp / "spec.json")], world=world, log_dir=tmp, timeout_s=900, env=env)
    result = torch.load(tmp / "result.pt", weights_only=False)
    assert result["dp_world_size"] == dp
    assert result["params_dtype"] == "torch.float32"  # from the config, no backend option
    return result["steps"]


@pytest.fixture(scope="module")
def fsdp_reference(tiny_tp_model: Path) -> list[dict]:
    return _fsdp_run(tiny_tp_model, _steps())


def _assert_same_training(got: list[dict], reference: list[dict], model_dir: Path) -> None:
    initial = load_file(model_dir / "model.safetensors")
    for step, (meg, ref) in enumerate(zip(got, reference, strict=True)):
        m, r = meg["metrics"], ref["metrics"]
        assert r["grad_norm"] > CLIP, "grad_clip should be active for the test to cover clipping"
        assert m["loss"] == pytest.approx(r["loss"], rel=1e-5), step
        assert m["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-5), step
        for key in ("entropy", "kl_divergence_inference", "num_tokens", "num_samples", "learning_rate"):
            assert m[key] == pytest.approx(r[key], rel=1e-5), (step, key)
        assert m["skipped_steps"] == r["skipped_steps"] == 0
        assert set(m) == set(r), "both backends report the same metrics"
        assert set(meg["weights"]) == set(ref["weights"])
        for name, tensor in meg["weights"].items():
            assert tensor.shape == ref["weights"][name].shape, name
            diff = (tensor - ref["weights"][name]).abs().max().item()
            assert diff < 1e-5, (step, name, diff)
    # The comparison means something: every weight matrix moved by far more than the tolerance.
    final = got[-1]["weights"]
    for name, tensor in initial.items():
        if tensor.dim() > 1:
            assert (final[name] - tensor).abs().max().item() > 1e-4, name


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_matches_fsdp(tiny_tp_model: Path, fsdp_reference: list[dict], tmp_path: Path, tp: int):
    _assert_same_training(
        _megatron_run(tiny_tp_model, _steps(), tmp_path, tp=tp), fsdp_reference, tiny_tp_model
    )


def test_dr_grpo_token_sum_norm_over_micro_batches_and_ranks_matches_one_micro_batch(
    tiny_tp_model: Path, tmp_path: Path
):
    steps = _steps()
    for samples in steps:  # what the Megatron side trains on: several micro-batches on each DP rank
        per_rank = pack_samples(
            [TrainingSample(**s) for s in samples], seq_len=SEQ_LEN, pad_to_multiple_of=PAD, num_ranks=2
        )
        assert all(len(mbs) >= 2 for mbs in per_rank)
    reference = _fsdp_run(tiny_tp_model, steps, overrides=DR_GRPO, seq_len=ONE_ROW)
    got = _megatron_run(tiny_tp_model, steps, tmp_path, tp=1, dp=2, overrides=DR_GRPO)
    _assert_same_training(got, reference, tiny_tp_model)
