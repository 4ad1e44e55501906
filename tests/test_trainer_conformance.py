"""The trainer protocol, tested the same way on every backend (FSDP and Megatron).

Each backend runs in its own process (``conformance_worker.py``, one gloo rank), created through
the ``telescope.trainers`` entry point as ``telescope train`` does, on the same tiny Llama and
the same steps: ``dr_grpo`` with ``token_sum_norm`` (its loss divides by the step's sample count,
so a backend that normalises by the local micro-batch is caught), a warmup schedule (so a backend
one step ahead in its LR is caught), float32 and no dropout. What every backend must do:

- be a ``TrainerBackend``; without ``lora_rank`` no adapter (``adapter_config()`` is None and
  ``adapter_weights()`` refuses); its ``row_multiple`` and ``shares_prompts`` (FSDP's CPU attention shares a
  group's prompt, Megatron's does not: the steps' samples come in groups of one prompt, so the
  backends agreeing also checks shared-prompt packing); the seed it was given is torch's seed;
- ``train_step`` returns the protocol's metric keys; the LR of step k is ``lr · lr_multiplier(k-1)``;
- the loss of a step is the same whether its samples come in several micro-batches or one row;
- ``save_checkpoint`` writes into exactly the folder given (the caller makes it: a missing one is an
  error) and returns ``{"backend": name, ...}``;
  under the orchestrator's layout, the folder is listed, loads into a fresh trainer (another seed), which
  redoes the next step exactly; retention keeps the newest; a weights-only folder loads with
  ``weights_only`` and is refused without it;
- ``convert_checkpoint`` gives a folder transformers loads with the trained weights;
- on-policy distillation with a reference KL (samples with teacher and reference logprobs) reports
  the teacher's reverse KL of the hand computation, and a reference KL;
- frozen models in the trainer (``frozen_models``: a teacher of another size, the reference model at
  the starting weights; samples without their logprobs): the teacher's and reference model's logprobs
  in ``step_tokens`` are transformers' own, the teacher's reverse KL is that of the hand computation
  with them, and the reference KL is 0 at step 1;
- a supervised step (``objective="sft"``) has the loss of transformers' own negative
  log-likelihood of the trained tokens;
- ``step_tokens`` gives, read back by sample, what the loss trained each token with: transformers'
  own logprobs of the starting weights at step 1, the loss mask, the sample's advantage (under
  ``opd``: with the teacher's term, by hand), no TIS weight or clipping; nothing after a supervised step;
- and both backends agree: the same loss, LR and metrics at every step, and under ``opd``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from telescope_algos.testing import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKER = Path(__file__).with_name("conformance_worker.py")
BACKENDS = ["fsdp", "megatron"]
LR = 1e-3
OVERRIDES = {
    "algorithm": "dr_grpo",
    "dr_grpo_loss_agg_mode": "token_sum_norm",
    "learning_rate": LR,
    "lr_scheduler": "constant",
    "warmup_steps": 2,
    "number_of_steps": 4,
    "model_dtype": "float32",
    "mixed_precision_dtype": None,
    "max_tokens": 16,
    "seed": 1234,
}
REQUIRED = (
    "loss", "entropy", "kl_divergence_inference", "grad_norm", "learning_rate", "num_tokens",
    "num_samples", "skipped_steps", "timing/step",
)  # fmt: skip


def _sample(rng: random.Random, prompt: list[int]) -> dict:
    completion = [rng.randrange(3, 400) for _ in range(rng.randint(6, 12))]
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "advantage": rng.uniform(-2, 2),
        "rollout_logprobs": [-rng.uniform(3, 7) for _ in completion],
    }


def _steps() -> list[list[dict]]:
    rng = random.Random(7)
    steps = []
    for sizes in ((2, 2, 2), (3, 2)):  # groups of samples that share their prompt
        samples = []
        for size in sizes:
            prompt = [rng.randrange(3, 400) for _ in range(rng.randint(3, 6))]
            samples += [_sample(rng, prompt) for _ in range(size)]
        steps.append(samples)
    return steps


OPD = {"algorithm": "opd", "teacher_model": "a-teacher", "distill_reward_weight": 0.5, "ref_kl_coef": 0.1}
IN_TRAINER = {**OPD, "teacher_placement": "trainer", "ref_placement": "trainer"}


def _opd_samples() -> list[dict]:
    """The first step's samples with a teacher's and a reference model's logprob for each token."""
    rng = random.Random(11)
    return [
        {
            **s,
            "teacher_logprobs": [-rng.uniform(1, 8) for _ in s["completion_ids"]],
            "ref_logprobs": [-rng.uniform(3, 7) for _ in s["completion_ids"]],
        }
        for s in _steps()[0]
    ]


def _sft_samples() -> list[dict]:
    """Conversations as a supervised step takes them: advantage 1, trained tokens masked 1 (here the
    first half of each completion, as if the rest were a user's turn)."""
    return [
        {
            "prompt_ids": s["prompt_ids"],
            "completion_ids": s["completion_ids"],
            "advantage": 1.0,
            "completion_mask": [
                int(j < len(s["completion_ids"]) // 2) for j in range(len(s["completion_ids"]))
            ],
        }
        for s in _steps()[1]
    ]


def _run(backend: str, model_dir: Path, teacher_dir: Path, tmp: Path) -> dict:
    spec = {
        "backend": backend, "model_dir": str(model_dir), "overrides": OVERRIDES, "steps": _steps(),
        "seq_len": 24, "one_row_seq_len": 256, "dir": str(tmp), "out": str(tmp / "out.pt"),
        "opd": {"overrides": OPD, "samples": _opd_samples()},
        "frozen": {"overrides": IN_TRAINER, "teacher_dir": str(teacher_dir)},
        "sft": _sft_samples(),
    }  # fmt: skip
    (tmp / "spec.json").write_text(json.dumps(spec))
    run_ranks(WORKER, [str(tmp / "spec.json")], world=1, log_dir=tmp, timeout_s=900, env={"TMPDIR": str(tmp)})
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.fixture(scope="module")
def results(
    tiny_model_dir: Path, tiny_tp_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict]:
    # the teacher: the same tokenizer, twice the width and four heads
    return {b: _run(b, tiny_model_dir, tiny_tp_model, tmp_path_factory.mktemp(b)) for b in BACKENDS}


def _same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        torch.testing.assert_close(value, b[name], atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_protocol_seed_and_metrics(results, backend):
    r = results[backend]
    assert r["is_protocol"]
    assert r["adapter_config"] is None  # the full model trains: no LoRA adapter to send
    assert "lora_rank" in r["adapter_weights_error"]
    assert r["row_multiple"] == 1
    assert r["shares_prompts"] == (backend == "fsdp")
    assert r["initial_seed"] == 1234  # the config's seed reached the trainer
    assert r["facts"]["backend"] == backend
    for m in r["metrics"]:
        missing = [k for k in REQUIRED if k not in m]
        assert not missing, missing
    # constant schedule, warmup 2: lr_multiplier(0) = 0/2, lr_multiplier(1) = 1/2 (steps 1 and 2)
    assert [m["learning_rate"] for m in r["metrics"]] == pytest.approx([0.0, LR / 2])
    assert r["metrics"][1]["num_samples"] == 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_is_the_same_however_the_step_is_split(results, backend):
    r = results[backend]
    assert r["micro_batch_counts"][0] > 1, "the test wants several micro-batches"
    assert r["one_row_count"] == 1
    for key in ("loss", "entropy", "num_tokens", "num_samples"):
        assert r["metrics"][0][key] == pytest.approx(r["one_row"][key], rel=1e-5), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_round_trip_retention_and_export(results, backend):
    r = results[backend]
    assert r["meta_2"]["backend"] == backend
    assert r["meta_2"]["step"] == 2
    assert r["listed"] == [2, 3]  # keep_last 2 after step 3
    # nothing outside the folders given: the checkpoints, and the bare folder saved for its facts
    assert r["root"] == ["step_2", "step_3", "step_99.tmp"]
    assert "does not exist" in r["missing_folder_error"]
    # a trainer with another seed resumed from step_1 redoes step 2 exactly
    assert r["resumed_metrics"]["loss"] == r["metrics"][1]["loss"]
    assert r["resumed_metrics"]["learning_rate"] == r["metrics"][1]["learning_rate"]
    _same_weights(r["resumed_end"], r["weights_end"])
    _same_weights(r["loaded_end"], r["weights_end"])
    _same_weights(r["loaded_weights_only"], r["weights_end"])
    assert "weights only" in r["weights_only_error"]
    converted = {k: v for k, v in r["converted"].items() if k in r["weights_end"]}
    _same_weights(converted, r["weights_end"])
    assert any(not torch.equal(r["weights_1"][k], r["weights_end"][k]) for k in r["weights_end"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_distillation_and_the_reference_kl(results, backend):
    m = results[backend]["opd"]
    samples = _opd_samples()
    # every completion token is a loss token (each sample has a prompt): mean of ℓ^roll − ℓ^T over them
    gaps = [r - t for s in samples for r, t in zip(s["rollout_logprobs"], s["teacher_logprobs"], strict=True)]
    assert m["teacher_reverse_kl"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-5)
    assert m["num_tokens"] == len(gaps)
    assert m["ref_kl"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_models_in_the_trainer_score_as_transformers_does(results, backend):
    r = results[backend]
    m = r["frozen"]
    samples = _steps()[0]
    gaps = []
    for k, (sample, tokens, teacher, start) in enumerate(
        zip(samples, r["frozen_tokens"], r["hf_teacher_logprobs_1"], r["hf_logprobs_1"], strict=True)
    ):
        assert _completion(tokens, "teacher_logprob", sample) == pytest.approx(teacher, abs=1e-4), k
        assert _completion(tokens, "ref_logprob", sample) == pytest.approx(start, abs=1e-4), k
        # distill_reward_weight · A + (ℓ^T − ℓ^roll), with the teacher's logprobs by transformers
        expected = [
            0.5 * sample["advantage"] + t - roll
            for t, roll in zip(teacher, sample["rollout_logprobs"], strict=True)
        ]
        assert _completion(tokens, "advantage", sample) == pytest.approx(expected, rel=1e-4, abs=1e-4), k
        gaps += [roll - t for t, roll in zip(teacher, sample["rollout_logprobs"], strict=True)]
    assert m["teacher_reverse_kl"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-5)
    assert abs(m["ref_kl"]) < 1e-6  # the reference is the very weights the step starts from
    assert m["num_tokens"] == len(gaps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_supervised_step_is_the_negative_log_likelihood_of_its_trained_tokens(results, backend):
    r = results[backend]
    m = r["sft"]
    assert m["loss"] == pytest.approx(r["sft_nll"], rel=1e-5)
    assert m["num_tokens"] == sum(sum(s["completion_mask"]) for s in _sft_samples())
    assert "kl_divergence_inference" not in m  # no sampler: nothing to compare with
    assert m["grad_norm"] > 0


def _completion(sample_tokens: dict, field: str, sample: dict) -> list[float]:
    n = len(sample["prompt_ids"])
    return sample_tokens[field][n : n + len(sample["completion_ids"])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_tokens_are_what_the_loss_trained_each_token_with(results, backend):
    r = results[backend]
    for k, (sample, tokens, hf) in enumerate(
        zip(_steps()[0], r["tokens_1"], r["hf_logprobs_1"], strict=True)
    ):
        assert _completion(tokens, "trainer_logprob", sample) == pytest.approx(hf, abs=1e-4), k
        assert _completion(tokens, "loss_mask", sample) == [1.0] * len(hf)
        assert tokens["loss_mask"][0] == 0.0 or math.isnan(tokens["loss_mask"][0])  # NaN: its root's
        assert _completion(tokens, "advantage", sample) == pytest.approx([sample["advantage"]] * len(hf))
        assert _completion(tokens, "is_weight", sample) == [1.0] * len(hf)
        assert _completion(tokens, "clipped", sample) == [0.0] * len(hf)
    for sample, tokens in zip(_opd_samples(), r["opd_tokens"], strict=True):
        # distill_reward_weight · A + distill_coef (1) · (ℓ^T − ℓ^roll)
        expected = [
            0.5 * sample["advantage"] + t - roll
            for t, roll in zip(sample["teacher_logprobs"], sample["rollout_logprobs"], strict=True)
        ]
        assert _completion(tokens, "advantage", sample) == pytest.approx(expected, rel=1e-5)
    assert r["sft_tokens"] == []


def test_both_backends_agree(results):
    fsdp, meg = results["fsdp"], results["megatron"]
    for step, (a, b) in enumerate(zip(fsdp["metrics"], meg["metrics"], strict=True)):
        for key in ("loss", "entropy", "kl_divergence_inference", "grad_norm", "learning_rate", "num_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (step, key)
    for a, b in zip(fsdp["tokens_1"], meg["tokens_1"], strict=True):
        # FSDP shares prompts: NaN where the family's root holds the token
        held = [not math.isnan(x) for x in a["trainer_logprob"]]
        mine = [x for x, h in zip(a["trainer_logprob"], held, strict=True) if h]
        theirs = [y for y, h in zip(b["trainer_logprob"], held, strict=True) if h]
        assert mine == pytest.approx(theirs, abs=1e-5)
    for name in ("opd", "frozen"):
        a, b = fsdp[name], meg[name]
        for key in ("loss", "teacher_reverse_kl", "ref_kl", "grad_norm", "num_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (name, key)
