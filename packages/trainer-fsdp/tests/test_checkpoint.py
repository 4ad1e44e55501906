"""Checkpoints on one gloo rank: layout, round trip, resume equivalence, weights-only, atomicity,
retention, and conversion to a Hugging Face folder that transformers loads."""

from __future__ import annotations

import json

import pytest
import torch

from telescope_algos import pack_samples
from telescope_trainer_fsdp import _state as state_module
from telescope_trainer_fsdp import convert_checkpoint, list_checkpoints, read_meta


def _batches(helpers, steps, seed=100):
    return [pack_samples(helpers.make_samples(4, seed=seed + s), seq_len=32)[0] for s in range(steps)]


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_resume_equals_training_straight_through(helpers, tiny_model_dir, tmp_path):
    # Warmup + cosine: a scheduler restarted from scratch on resume (the original's bug) changes the LR.
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
        path = trainer.save_checkpoint(tmp_path, step=2, extra_state={"sampler": {"index": 7}})
        rng_after_save = torch.rand(3)
    assert path == tmp_path / "step_2"
    with helpers.open_trainer(cfg, seed=123) as trainer:
        extra = trainer.load_checkpoint(tmp_path)
        assert torch.equal(torch.rand(3), rng_after_save)
        second = [trainer.train_step(batches[s], step=s)["learning_rate"] for s in (2, 3)]
        resumed = helpers.hf_state(trainer)
    assert extra == {"sampler": {"index": 7}}
    # 1e-3 x [0 (warmup), 1, 0.1 + 0.9 x (1 + cos(pi/3))/2 = 0.775, 0.1 + 0.9 x (1 + cos(2pi/3))/2 = 0.325]
    assert straight == pytest.approx([0.0, 1e-3, 7.75e-4, 3.25e-4])
    assert first + second == pytest.approx(straight)
    _assert_same(resumed, expected)


def test_layout_and_metadata(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir)
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        path = trainer.save_checkpoint(tmp_path / "ckpts", step=1)
        with pytest.raises(TypeError, match="JSON-serialisable"):
            trainer.save_checkpoint(tmp_path / "ckpts", step=2, extra_state={"x": object()})
    names = {p.name for p in path.iterdir()}
    assert {"meta.json", ".metadata", "hf_meta", "trainer_state.pt", "rng_state_rank_0.pt"} <= names
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (path / "hf_meta").iterdir()
    }
    meta = read_meta(path)
    assert meta["backend"] == "fsdp"
    assert meta["step"] == 1
    assert meta["world_size"] == 1
    assert meta["training_state"] is True
    assert meta["extra_state"] == {}
    assert len(meta["config_sha256"]) == 64
    assert [s for s, _ in list_checkpoints(tmp_path / "ckpts")] == [1]  # the failed step 2 left nothing


def test_weights_only_checkpoint(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir, checkpoint_save_training_state=False)
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        trained = helpers.hf_state(trainer)
        path = trainer.save_checkpoint(tmp_path, step=1)
    names = {p.name for p in path.iterdir()}
    assert "trainer_state.pt" not in names
    assert not any(n.startswith("rng_state") for n in names)
    assert read_meta(path)["training_state"] is False
    with helpers.open_trainer(cfg) as trainer:
        before = helpers.hf_state(trainer)
        trainer.load_checkpoint(path)
        _assert_same(helpers.hf_state(trainer), trained)
    assert any(not torch.equal(before[n], trained[n]) for n in trained)


def test_interrupted_save_never_replaces_the_last_good_one(helpers, tiny_model_dir, tmp_path, monkeypatch):
    cfg = helpers.make_config(tiny_model_dir)
    batches = _batches(helpers, 2)
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(batches[0], step=0)
        good = helpers.hf_state(trainer)
        trainer.save_checkpoint(tmp_path, step=1)
        trainer.train_step(batches[1], step=1)

        real_save = state_module.dcp.save

        def dying_save(state, *, checkpoint_id):
            real_save(state, checkpoint_id=checkpoint_id)
            raise OSError("disk full")

        monkeypatch.setattr(state_module.dcp, "save", dying_save)
        with pytest.raises(OSError, match="disk full"):
            trainer.save_checkpoint(tmp_path, step=1)  # re-saving the same step dies half way
        assert (tmp_path / "step_1.tmp").is_dir()
        assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
        monkeypatch.setattr(state_module.dcp, "save", real_save)
        trained = helpers.hf_state(trainer)

    with helpers.open_trainer(cfg) as trainer:
        trainer.load_checkpoint(tmp_path)
        _assert_same(helpers.hf_state(trainer), good)
        trainer.train_step(batches[1], step=1)  # resumed: the same update as before the failed save
        _assert_same(helpers.hf_state(trainer), trained)
        trainer.save_checkpoint(tmp_path, step=1)  # clears the leftover, replaces the old checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
    with helpers.open_trainer(cfg) as trainer:
        trainer.load_checkpoint(tmp_path / "step_1")
        _assert_same(helpers.hf_state(trainer), trained)


def test_retention_runs_after_each_save(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir, checkpoint_keep_last=2, checkpoint_keep_every=3)
    with helpers.open_trainer(cfg) as trainer:
        for step in range(1, 6):
            trainer.save_checkpoint(tmp_path, step=step)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]  # newest two, plus the multiple of 3


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
        trainer.save_checkpoint(tmp_path / "ckpt", step=1)
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
