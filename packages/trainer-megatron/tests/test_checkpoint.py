"""The checkpoint contract, the LR schedule's position and the seed of the Megatron backend.

Fast tests (no torch.distributed): the learning rate of the k-th train step by hand,
``convert_checkpoint`` on hand-made folders (in a fresh interpreter: no megatron-core, no process
group) and its errors. One slow test on one gloo rank drives a real trainer through the protocol
as the CLI does: it makes each folder, saves with and without the training state, resumes, loads
the weights alone, and converts.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron_spawn import run_ranks

import telescope_config
from telescope_config.testing import make_config
from telescope_trainer_megatron import convert_checkpoint
from telescope_trainer_megatron._trainer import _learning_rate

LR = 1e-3


def _config(**overrides) -> telescope_config.TelescopeConfig:
    return make_config(**{"model": "unused", "train_backend": "megatron", **overrides})


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # constant, warmup 2: multiplier s/2 while s < 2, then 1; the k-th call uses s = k - 1.
        ("constant", [0.0, 0.5, 1.0, 1.0]),
        # linear, warmup 2, T = 6, rho = 0: after warmup 1 - (s - 2)/(6 - 2): s = 3 -> 1 - 1/4.
        ("linear", [0.0, 0.5, 1.0, 0.75]),
    ],
)
def test_kth_train_step_uses_lr_multiplier_of_k_minus_1(schedule: str, expected: list[float]):
    cfg = _config(learning_rate=LR, lr_scheduler=schedule, warmup_steps=2, number_of_steps=6)
    # scheduler_step is 0 before the first train_step and counts the steps done.
    got = [_learning_rate(cfg, steps_done) for steps_done in range(4)]
    assert got == pytest.approx([LR * m for m in expected])


def _fake_checkpoint(root: Path, *, layout: dict | None, legacy_meta: dict | None = None) -> Path:
    ckpt = root / "step_3"
    (ckpt / "hf").mkdir(parents=True)
    (ckpt / "hf" / "config.json").write_text('{"model_type": "llama"}')
    (ckpt / "hf" / "tokenizer.json").write_text("{}")
    (ckpt / "hf" / "model.safetensors").write_bytes(b"weights")
    if layout is not None:
        (ckpt / "layout.json").write_text(json.dumps(layout))
    if legacy_meta is not None:
        (ckpt / "meta.json").write_text(json.dumps(legacy_meta))
    return ckpt


def test_convert_copies_the_hf_folder_in_a_plain_process(tmp_path: Path):
    ckpt = _fake_checkpoint(tmp_path, layout={"backend": "megatron", "format": 2, "training_state": False})
    out = tmp_path / "out"
    code = (
        "import sys, torch.distributed as dist\n"
        "from telescope_trainer_megatron import convert_checkpoint\n"
        f"print(convert_checkpoint({str(ckpt)!r}, {str(out)!r}))\n"
        "assert not any(m.startswith('megatron') for m in sys.modules), 'megatron-core was imported'\n"
        "assert not dist.is_initialized()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (out / "model.safetensors").read_bytes() == b"weights"


def test_convert_reads_a_previous_format_checkpoint(tmp_path: Path):
    meta = {"backend": "megatron", "step": 3, "tp_size": 1, "pp_size": 1, "world_size": 1}
    ckpt = _fake_checkpoint(tmp_path, layout=None, legacy_meta=meta)
    assert convert_checkpoint(ckpt, tmp_path / "out") == tmp_path / "out"
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_convert_refuses_what_is_not_a_megatron_checkpoint(tmp_path: Path):
    fsdp = _fake_checkpoint(tmp_path / "a", layout=None, legacy_meta={"backend": "fsdp", "step": 3})
    with pytest.raises(FileNotFoundError, match="not a Megatron checkpoint"):
        convert_checkpoint(fsdp, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="not a Megatron checkpoint"):
        convert_checkpoint(tmp_path / "missing", tmp_path / "out")
    broken = _fake_checkpoint(tmp_path / "b", layout={"backend": "megatron", "format": 2})
    (broken / "hf" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks config\.json or model safetensors"):
        convert_checkpoint(broken, tmp_path / "out")
    for damaged in ('{"backend": "mega', '["megatron"]'):
        (broken / "layout.json").write_text(damaged)
        with pytest.raises(ValueError, match=r"layout\.json is damaged .*another step"):
            convert_checkpoint(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _samples(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        c = [rng.randrange(3, 400) for _ in range(rng.randint(4, 12))]
        out.append(
            {
                "prompt_ids": [rng.randrange(3, 400) for _ in range(rng.randint(3, 8))],
                "completion_ids": c,
                "advantage": rng.uniform(-1, 1),
                "rollout_logprobs": [-rng.uniform(3, 7) for _ in c],
            }
        )
    return out


def _same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_protocol_on_one_rank(tiny_tp_model: Path, tmp_path: Path, dtype: str):
    """bfloat16 adds the optimizer's fp32 main parameters, which a weights-only load must refresh."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rng = random.Random(5)
    steps = [_samples(rng, 4) for _ in range(3)]
    spec = {
        "model_dir": str(tiny_tp_model),
        "seq_len": 48,
        "steps": steps,
        "checkpoint": True,
        "weights_only_checks": True,
        "save_after": 1,  # two steps done (learning rates 0 and lr/2): the weights have moved
        "overrides": {
            "learning_rate": LR,
            "lr_scheduler": "constant",
            "warmup_steps": 2,
            "mixed_precision_dtype": None if dtype == "float32" else dtype,
            "seed": 7,
        },
        "options": {"adam_eps": 1e-4},
    }
    result = run_ranks(spec, 1, tmp_path, timeout=900)
    # LR: the k-th call trains with lr_multiplier(k - 1) = 0, 1/2, 1, whatever `step` the caller passes
    # (the worker passes 1, 2, 3); the resumed trainer continues at its saved position (lr).
    assert [s["metrics"]["learning_rate"] for s in result["steps"]] == pytest.approx([0.0, LR / 2, LR])
    assert result["scheduler_step_saved"] == result["scheduler_step"] == 2
    [resumed] = result["resumed"]
    assert resumed["metrics"]["learning_rate"] == pytest.approx(LR)
    assert resumed["metrics"]["loss"] == result["steps"][2]["metrics"]["loss"]
    _same_weights(resumed["weights"], result["steps"][2]["weights"])
    # Seed: config.seed reached Python and NumPy before the model was built.
    assert result["rng_after_create"]["python"] == random.Random(7).random()
    assert result["rng_after_create"]["numpy"] == np.random.RandomState(7).rand()

    saved = result["steps"][1]["weights"]  # what both checkpoints hold
    initial = load_file(tiny_tp_model / "model.safetensors")
    assert any(not torch.equal(saved[n], t) for n, t in initial.items()), "the saved weights moved"
    # Weights only: the model from hf/; optimizer, schedule and counters stay a fresh trainer's.
    assert "weights_only=True" in result["no_state_error"]
    _same_weights(result["weights_only"]["weights"], saved)
    assert result["weights_only"]["scheduler_step"] == 0
    assert result["weights_only"]["skipped_steps_total"] == 0
    # A full load under another layout is refused with the fix; the weights alone still load.
    error = result["layout_error"]
    for part in ("another layout", "'tp_size': (2, 1)", "weights_only=True", "model: "):
        assert part in error, part
    _same_weights(result["other_layout_weights"], saved)
    # Training on from the weights alone = a new trainer built on the hf/ folder, bit for bit.
    after, built = result["after_weights_only"], result["built_on_hf"]
    assert after["metrics"]["loss"] == built["metrics"]["loss"]
    _same_weights(after["weights"], built["weights"])

    # Exactly the folders the caller made, with nothing around them and no meta.json.
    root = tmp_path / "ckpt"
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "weights_2"]
    full, weights = root / "step_2", root / "weights_2"
    assert sorted(p.name for p in full.iterdir()) == ["hf", "layout.json", "shards"]
    assert sorted(p.name for p in weights.iterdir()) == ["hf", "layout.json"]
    [facts] = result["checkpoint_facts"]
    [weights_facts] = result["weights_only_facts"]
    assert facts == json.loads((full / "layout.json").read_text())
    assert weights_facts == json.loads((weights / "layout.json").read_text())
    assert (facts["training_state"], weights_facts["training_state"]) == (True, False)
    assert {k: v for k, v in facts.items() if k != "training_state"} == {
        k: v for k, v in weights_facts.items() if k != "training_state"
    }
    assert facts["backend"] == "megatron"
    assert (facts["world_size"], facts["tp_size"], facts["params_dtype"]) == (1, 1, dtype)
    assert facts["padded_vocab_size"] % 64 == 0
    assert facts["vocab_size"] <= facts["padded_vocab_size"]

    # convert_checkpoint: both folders become Hugging Face folders transformers loads.
    for ckpt in (full, weights):
        out = convert_checkpoint(ckpt, tmp_path / f"hf_{ckpt.name}")
        # float32 holds every saved tensor exactly (bfloat16 runs keep some, e.g. norms, in float32).
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        state = {n: t for n, t in model.state_dict().items() if n in saved}
        _same_weights(state, {n: t.float() for n, t in saved.items()})
        assert AutoTokenizer.from_pretrained(out).encode("The answer is 42.")
