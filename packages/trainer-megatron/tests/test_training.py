"""Multi-process training on gloo against a plain transformers + AdamW reference (slow).

Reference: the same tiny Hugging Face weights, each sample run alone (no packing), the same
``telescope_algos.compute_loss`` with the step's token count, ``clip_grad_norm_`` and
``torch.optim.AdamW`` with the trainer's hyper-parameters (Megatron excludes 1-D parameters from
weight decay; so does the reference). Both run in float32.

Tolerances: loss and grad norm to 1e-5 relative (fp32 summation order differs: packed vs. unpacked
rows, TP all-reduces). Updated weights to 1e-5 absolute (1% of one lr-sized step) with lr 1e-3.
Adam's eps is 1e-4 here so an update is smooth in the gradient (with eps 1e-8, 1e-9 of gradient
noise flips a whole lr-sized step). Weight decay wrongly applied to a norm weight (1.0) would
show as lr·wd = 1e-4.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
import torch
from megatron_spawn import run_ranks

LR, EPS, WD = 1e-3, 1e-4, 0.1

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _samples(rng: random.Random, n: int, vocab: int) -> list[dict]:
    out = []
    for _ in range(n):
        p = [rng.randrange(1, vocab) for _ in range(rng.randint(3, 8))]
        c = [rng.randrange(1, vocab) for _ in range(rng.randint(4, 12))]
        out.append(
            {
                "prompt_ids": p,
                "completion_ids": c,
                "advantage": rng.uniform(-1, 1),
                "rollout_logprobs": [-rng.uniform(3, 7) for _ in c],
            }
        )
    return out


def _reference(model_dir: Path, steps: list[list[dict]]) -> list[dict]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from telescope_algos import LossInputs, LossOptions, compute_loss, token_logprobs_and_entropy

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups = [
        {"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": WD},
        {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=EPS)
    out = []
    for samples in steps:
        total = sum(len(s["completion_ids"]) for s in samples)
        opt.zero_grad()
        loss_sum = 0.0
        for s in samples:
            n_p = len(s["prompt_ids"])
            ids = torch.tensor([s["prompt_ids"] + s["completion_ids"]])
            mask = torch.tensor([[False] * n_p + [True] * len(s["completion_ids"])])
            rollout = torch.tensor([[0.0] * n_p + s["rollout_logprobs"]])
            lp, ent = token_logprobs_and_entropy(model(ids).logits, ids)
            loss, _ = compute_loss(
                LossInputs(
                    lp,
                    advantages=torch.full(ids.shape, s["advantage"]),
                    loss_mask=mask,
                    rollout_logprobs=rollout,
                    entropy=ent.detach(),
                    num_tokens=total,
                ),
                LossOptions(),
            )
            loss.backward()
            loss_sum += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            weights = load_file(f"{d}/model.safetensors")
        out.append({"loss": loss_sum, "grad_norm": norm, "weights": weights})
    return out


def _check_against_reference(result: dict, reference: list[dict]) -> None:
    for got, ref in zip(result["steps"], reference, strict=True):
        m = got["metrics"]
        assert m["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        assert m["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
        assert set(got["weights"]) == set(ref["weights"])
        for name, tensor in got["weights"].items():
            diff = (tensor - ref["weights"][name]).abs().max().item()
            assert diff < 1e-5, (name, diff)
        for key in ("entropy", "kl_divergence_inference", "learning_rate", "num_tokens", "timing/step"):
            assert key in m


def _check_frozen_reference(result: dict, samples: list[dict]) -> None:
    """A frozen reference that is the model itself scores every token as the policy does at step 1,
    through the tensor-parallel vocabulary and on the last pipeline stage: the reference KL is 0 and
    the two logprobs agree on every loss token."""
    frozen = result["frozen"]
    assert frozen["metrics"]["loss"] == pytest.approx(result["steps"][0]["metrics"]["loss"], rel=1e-5)
    assert abs(frozen["metrics"]["ref_kl"]) < 1e-6
    rows = [row for rank in frozen["tokens"] for row in rank if row is not None]
    assert rows, "no rank recorded its tokens"
    compared = 0
    for row in rows:
        on = row["loss_mask"] > 0
        # float32 logprobs near -10 (an ulp is 1e-6), each pass with its own order of sums over the
        # split vocabulary: a few tens of ulps apart at most (CI saw 2.1e-5); a wrong model or token: > 0.1
        assert abs(row["ref_logprob"][on] - row["trainer_logprob"][on]).max() < 1e-4
        compared += int(on.sum())
    assert compared >= sum(len(s["completion_ids"]) for s in samples)  # each loss token (TP ranks: twice)


@pytest.mark.parametrize(("world", "tp", "pp"), [(1, 1, 1), (2, 2, 1), (2, 1, 1), (2, 1, 2)])
def test_training_matches_reference_and_resumes_exactly(
    tiny_tp_model: Path, tmp_path: Path, world: int, tp: int, pp: int
):
    rng = random.Random(world * 100 + tp * 10 + pp)
    vocab = 400
    steps = [_samples(rng, 6, vocab), _samples(rng, 5, vocab)]
    spec = {
        "model_dir": str(tiny_tp_model),
        "seq_len": 48,
        "steps": steps,
        "checkpoint": True,
        "overrides": {
            "learning_rate": LR,
            "weight_decay": WD,
            "megatron_tensor_parallel_size": tp,
            "megatron_pipeline_parallel_size": pp,
            "mixed_precision_dtype": None,  # compute in model_dtype, float32
        },
        "options": {"adam_eps": EPS},  # betas: the default 0.9/0.999, as the reference
        "frozen": world > 1,  # the step again with the model as its frozen reference, TP or PP 2
    }
    result = run_ranks(spec, world, tmp_path, timeout=900)
    assert result["dp_world_size"] == world // (tp * pp)
    assert result["params_dtype"] == "torch.float32"
    _check_against_reference(result, _reference(tiny_tp_model, steps))
    if world > 1:
        _check_frozen_reference(result, steps[0])
    # Checkpoint round trip: a fresh trainer loaded from step 0 repeats step 1 bit for bit.
    assert result["returned"] is None
    assert result["scheduler_step"] == 1
    resumed, original = result["resumed"][0], result["steps"][1]
    assert resumed["metrics"]["loss"] == original["metrics"]["loss"]
    for name, tensor in original["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name
    # The save wrote into exactly the folder it was given: every rank's shard, layout.json, hf/.
    ckpt = tmp_path / "ckpt" / "step_1"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_1"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["hf", "layout.json", "shards"]
    assert sorted(p.name for p in (ckpt / "shards").iterdir()) == [f"rank_{r:05d}.pt" for r in range(world)]
    assert (ckpt / "hf" / "model.safetensors").is_file()
    assert (ckpt / "hf" / "config.json").is_file()
    facts = result["checkpoint_facts"]
    assert all(f == facts[0] for f in facts), "save_checkpoint returns the same facts on every rank"
    assert facts[0] == json.loads((ckpt / "layout.json").read_text())
    expected = {"backend": "megatron", "world_size": world, "tp_size": tp, "pp_size": pp, "cp_size": 1}
    assert facts[0].items() >= {**expected, "ep_size": 1, "params_dtype": "float32"}.items()
    assert facts[0]["training_state"] is True
