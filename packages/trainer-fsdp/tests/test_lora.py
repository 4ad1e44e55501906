"""LoRA on one gloo rank (``_lora``): the base model frozen, only adapters trained and in the
optimizer, the merged weights equal the base weights plus (alpha / rank) B A and give a plain
transformers model the trainer's own logprobs, a resume is exact, and bad settings are refused
with the layer and the fix. Tied and untied embeddings."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from telescope_algos import pack_samples
from telescope_trainer_fsdp._lora import merged_hf_weights

LORA = {"lora_rank": 4, "lora_alpha": 8.0, "learning_rate": 1e-2}


def _batches(helpers, steps, seed=300):
    return [pack_samples(helpers.make_samples(4, seed=seed + s), seq_len=32)[0] for s in range(steps)]


def _base(model_dir) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_only_adapters_train_and_the_merged_model_is_what_the_trainer_computes(
    helpers, tiny_model_dir, tiny_tied_model_dir, tied
):
    from transformers import AutoModelForCausalLM

    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    base = _base(model_dir)
    cfg = helpers.make_config(model_dir, **LORA)
    with helpers.open_trainer(cfg) as trainer:
        before = helpers.hf_state(trainer)
        # B starts at zero: the merged model is the base model, under the base model's names
        assert before.keys() == {k for k in base if not (tied and k == "lm_head.weight")}
        for name, tensor in before.items():
            torch.testing.assert_close(tensor, base[name], atol=0, rtol=0)
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable
        assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
        optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
        assert optimized == {id(p) for p in trainer.model.parameters() if p.requires_grad}
        for batch in _batches(helpers, 2):
            trainer.train_step(batch, step=0)
        after = helpers.hf_state(trainer)
        params = {n: p.full_tensor().detach().clone() for n, p in trainer.model.named_parameters()}
        ids = torch.tensor([[5, 17, 250, 33, 9, 101, 7, 300]])
        trainer.model.eval()
        with torch.no_grad():
            ours = trainer.model(input_ids=ids).logits
    # the frozen base did not move; the targeted layers moved by exactly (alpha / rank) B A
    layer = "model.layers.0.self_attn.q_proj"
    a = params[f"base_model.model.{layer}.lora_A.default.weight"]
    b = params[f"base_model.model.{layer}.lora_B.default.weight"]
    assert b.abs().max() > 0
    torch.testing.assert_close(params[f"base_model.model.{layer}.base_layer.weight"], base[f"{layer}.weight"])
    torch.testing.assert_close(after[f"{layer}.weight"], base[f"{layer}.weight"] + 2.0 * (b @ a))
    torch.testing.assert_close(after["model.norm.weight"], base["model.norm.weight"], atol=0, rtol=0)
    # a plain transformers model with the merged weights computes the trainer's logits
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain.load_state_dict(after, strict=not tied)
    with torch.no_grad():
        theirs = plain(input_ids=ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_a_lora_resume_equals_training_straight_through(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(tiny_model_dir, **LORA)
    batches = _batches(helpers, 4)
    with helpers.open_trainer(cfg) as trainer:
        for s in range(4):
            trainer.train_step(batches[s], step=s)
        expected = helpers.hf_state(trainer)
    with helpers.open_trainer(cfg) as trainer:
        for s in range(2):
            trainer.train_step(batches[s], step=s)
        (tmp_path / "step_2").mkdir()
        facts = trainer.save_checkpoint(tmp_path / "step_2")
    assert facts["lora"] == {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": cfg.lora_target_modules}
    with helpers.open_trainer(cfg, seed=7) as trainer:
        trainer.load_checkpoint(tmp_path / "step_2")
        for s in (2, 3):
            trainer.train_step(batches[s], step=s)
        resumed = helpers.hf_state(trainer)
    assert resumed.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], atol=0, rtol=0)


def test_merged_weights_of_a_hand_made_adapter():
    """A one-layer model with a hand-set adapter: W + (alpha / r) B A, under the base name."""
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(2, 2, bias=False)

    model = One()
    with torch.no_grad():
        model.proj.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # a plain module standing in for a transformers model
    peft = get_peft_model(cast(Any, model), LoraConfig(r=1, lora_alpha=2, target_modules=["proj"]))
    lora: Any = cast(Any, peft.base_model).model.proj  # the LoRA layer PEFT put in place of the Linear
    with torch.no_grad():
        lora.lora_A["default"].weight.copy_(torch.tensor([[1.0, -1.0]]))
        lora.lora_B["default"].weight.copy_(torch.tensor([[0.5], [2.0]]))
    merged = dict(merged_hf_weights(peft, {"rank": 1, "alpha": 2.0}))
    # scale 2; B A = [[0.5, -0.5], [2, -2]] -> W + 2 B A = [[2, 1], [7, 0]]
    assert list(merged) == ["proj.weight"]
    assert torch.equal(merged["proj.weight"], torch.tensor([[2.0, 1.0], [7.0, 0.0]]))


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"lora_rank": 200}, ["lora_rank 200 is larger than layer", "use lora_rank <= "]),
        ({"lora_rank": 4, "lora_target_modules": ["q_proj", "query"]},
         ["['query'] match no linear layer", "q_proj"]),
    ],
)  # fmt: skip
def test_bad_lora_settings_name_the_layer_and_the_fix(helpers, tiny_model_dir, overrides, fragments):
    cfg = helpers.make_config(tiny_model_dir, **overrides)
    with pytest.raises(ValueError, match="lora_") as err, helpers.open_trainer(cfg):
        pass
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_lora_checkpoint_converts_to_a_merged_model_or_a_peft_adapter(
    helpers, tiny_model_dir, tiny_tied_model_dir, tmp_path, tied
):
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from telescope_trainer_fsdp import convert_checkpoint

    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    cfg = helpers.make_config(model_dir, **LORA)
    with helpers.open_trainer(cfg) as trainer:
        trainer.train_step(_batches(helpers, 1)[0], step=0)
        trained = helpers.hf_state(trainer)
        (tmp_path / "ckpt").mkdir()
        trainer.save_checkpoint(tmp_path / "ckpt")
    out = convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    adapter = convert_checkpoint(tmp_path / "ckpt", tmp_path / "adapter", adapter_only=True)
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not (out / "adapter_config.json").exists()  # the merged model is a plain Hugging Face folder
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    state = merged.state_dict()
    for name, tensor in trained.items():  # what the servers received, bit for bit
        torch.testing.assert_close(state[name], tensor, atol=0, rtol=0)
    # the adapter alone, in PEFT's format, on the base model gives the merged model's logits
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, str(adapter))
    adapter_config = adapted.peft_config["default"]
    assert isinstance(adapter_config, LoraConfig)
    assert adapter_config.r == 4
    ids = torch.tensor([[5, 17, 250, 33, 9, 101]])
    with torch.no_grad():
        torch.testing.assert_close(
            adapted(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=0
        )


def test_the_reference_model_of_a_lora_run_is_its_base_with_the_adapters_off(helpers, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from telescope_algos import sample_tokens

    cfg = helpers.make_config(tiny_model_dir, **LORA, ref_kl_coef=0.1, ref_placement="trainer")
    steps = [helpers.make_samples(4, seed=300 + s) for s in range(3)]
    with helpers.open_trainer(cfg, frozen_models={"ref": str(tiny_model_dir)}) as trainer:
        assert trainer.frozen["ref"] is trainer.model  # no second copy of the base is loaded
        metrics = []
        for s, samples in enumerate(steps):
            mbs = pack_samples(samples, seq_len=32)[0]
            metrics.append(trainer.train_step(mbs, step=s))
        rows = trainer.step_tokens()
        assert rows
        assert all(r is not None for r in rows)
        lora_b = [p.full_tensor() for n, p in trainer.model.named_parameters() if ".lora_B." in n]
    assert any(b.abs().max() > 0 for b in lora_b)  # the adapters moved: the policy is not its base
    lengths = [len(x.prompt_ids) + len(x.completion_ids) for x in steps[-1]]
    ref = sample_tokens(mbs, [cast(Any, r)["ref_logprob"] for r in rows], lengths)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for k, x in enumerate(steps[-1]):
        with torch.no_grad():
            logprobs = torch.log_softmax(base(torch.tensor([x.prompt_ids + x.completion_ids])).logits[0], -1)
        n = len(x.prompt_ids)
        expected = [float(logprobs[n + j - 1, t]) for j, t in enumerate(x.completion_ids)]
        assert ref[k][n:].tolist() == pytest.approx(expected, abs=1e-4), k  # transformers' base model
    assert abs(metrics[0]["ref_kl"]) < 1e-6  # step 1: the policy is its base
    assert metrics[-1]["ref_kl"] > 1e-6
