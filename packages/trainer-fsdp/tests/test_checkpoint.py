"""Checkpoints on one gloo rank: what the backend writes into the folder it is given, round trip,
resume equivalence, weights-only, and conversion to a Hugging Face folder that transformers loads.
(The layout around the folder, its atomic rename and retention are the orchestrator's:
packages/orchestrator/tests.)"""

from __future__ import annotations

import json

import pytest
import torch

from telescope_algos import pack_samples
from telescope_trainer_fsdp import convert_checkpoint


def _batches(helpers, steps, seed=100):
    return [pack_samples(helpers.make_samples(4, seed=seed + s), seq_len=32)[0] for s in range(steps)]


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_resume_equals_training_straight_through(helpers, tiny_model_dir, tmp_path):
    # Warmup + cosine: a scheduler restarted from scratch on resume would change the LR.
    cfg = helpers.make_config(
        tiny_model_dir, lr_scheduler="cosine", warmup_steps=1, number_of_steps=4, min_lr_ratio=0.1
    )
    batches = _batches(helpers, 4)
    with helpers.open_trainer(cfg) as trainer:
        straight = [trainer.train_step(batches[s], step=s)["learning_rate"] for s in range(4)]
        expected = helpers.hf_state(trainer)
    with helpers.open_trainer(cfg) as trainer:
        first = [trainer.train_step(batches[s], step=s)["learning_rate"] for s in range(2)]
        torch.rand(5)  # move the RNG; the checkpoint must capture this state
        (tmp_path / "step_2").mkdir()  # the caller makes the folder
        facts = trainer.save_checkpoint(tmp_path / "step_2")
        rng_after_save = torch.rand(3)
    assert facts["backend"] == "fsdp"
    with helpers.open_trainer(cfg, seed=123) as trainer:
        assert trainer.load_checkpoint(tmp_path / "step_2") is None
        assert torch.equal(torch.rand(3), rng_after_save)
        second = [trainer.train_step(batches[s], step=s)["learning_rate"] for s in (2, 3)]
        resumed = helpers.hf_state(trainer)
    # 1e-3 x [0 (warmup), 1, 0.1 + 0.9 x (1 + cos(pi/3))/2 = 0.775, 0.1 + 0.9 x (1 + cos(2pi/3))/2 = 0.325]
    assert straight == pytest.approx([0.0, 1e-3, 7.75e-4, 3.25e-4])
    assert first + second == pytest.approx(straight)
    _assert_same(resumed, expected)


def test_the_backend_writes_only_into_the_folder_it_is_given(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir)
    (tmp_path / "unrelated.txt").write_text("keep")
    path = tmp_path / "step_1.tmp"
    path.mkdir()
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        facts = trainer.save_checkpoint(path)
    assert facts == {
        "backend": "fsdp", "world_size": 1, "model_path": str(tiny_model_dir), "model_dtype": "float32"
    }  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1.tmp", "unrelated.txt"]
    names = {p.name for p in path.iterdir()}
    assert {".metadata", "hf_meta", "trainer_state.pt", "rng_state_rank_0.pt"} <= names
    assert "meta.json" not in names  # the caller's file
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (path / "hf_meta").iterdir()
    }


def test_weights_only_checkpoint(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir)
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        trained = helpers.hf_state(trainer)
        trainer.save_checkpoint(tmp_path, training_state=False)
    names = {p.name for p in tmp_path.iterdir()}
    assert "trainer_state.pt" not in names
    assert not any(n.startswith("rng_state") for n in names)
    with helpers.open_trainer(cfg) as trainer:
        before = helpers.hf_state(trainer)
        with pytest.raises(ValueError, match="holds weights only"):
            trainer.load_checkpoint(tmp_path)
        trainer.load_checkpoint(tmp_path, weights_only=True)
        _assert_same(helpers.hf_state(trainer), trained)
    assert any(not torch.equal(before[n], trained[n]) for n in trained)


def test_a_folder_that_is_no_checkpoint_is_named(helpers, tiny_model_dir, tmp_path):
    with helpers.open_trainer(helpers.make_config(tiny_model_dir)) as trainer:
        with pytest.raises(FileNotFoundError, match="is not a checkpoint of the FSDP backend"):
            trainer.load_checkpoint(tmp_path)
        with pytest.raises(FileNotFoundError, match="does not exist \\(the caller makes it, empty\\)"):
            trainer.save_checkpoint(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="is not a checkpoint of the FSDP backend"):
        convert_checkpoint(tmp_path, tmp_path / "hf")


@pytest.mark.parametrize("tied", [False, True])
def test_conversion_loads_in_transformers_and_matches(
    helpers, tiny_model_dir, tiny_tied_model_dir, tmp_path, tied
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    cfg = helpers.make_config(model_dir)
    ids = torch.tensor([[5, 17, 250, 33, 9, 101]])
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        trained = helpers.hf_state(trainer)
        (tmp_path / "ckpt").mkdir()
        trainer.save_checkpoint(tmp_path / "ckpt")
    out = convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    assert (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in trained.items():
        torch.testing.assert_close(state[name], tensor, atol=0, rtol=0)
    if tied:
        assert "lm_head.weight" not in trained
        assert torch.equal(state["lm_head.weight"], trained["model.embed_tokens.weight"])
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference.load_state_dict(trained, strict=False)
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=0, rtol=0)
    assert AutoTokenizer.from_pretrained(out)("The answer is 42.").input_ids

    sharded = convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf_sharded", max_shard_bytes=60_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    again = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32).state_dict()
    for name, tensor in trained.items():
        torch.testing.assert_close(again[name], tensor, atol=0, rtol=0)
