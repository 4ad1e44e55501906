"""`telescope doctor`: machine report and the memory rule of thumb."""

from __future__ import annotations

import json

import pytest

from telescope_cli.commands.doctor import estimate_params, memory_estimate
from telescope_cli.main import main
from telescope_config.testing import make_config


def test_param_estimate_matches_smollm2_135m():
    # SmolLM2-135M: per layer attn 576*64*(2*9+2*3) = 884,736, mlp 3*576*1536 = 2,654,208, norms 1,152
    # -> 3,540,096 x 30 = 106,202,880; tied embedding 49,152*576 = 28,311,552; final norm 576.
    cfg = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "num_attention_heads": 9,
           "num_key_value_heads": 3, "intermediate_size": 1536, "tie_word_embeddings": True}  # fmt: skip
    assert estimate_params(cfg) == 134_515_008


def test_param_estimate_matches_a_real_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    counted = sum(p.numel() for p in model.parameters())
    assert estimate_params(json.loads((tiny_model_dir / "config.json").read_text())) == counted


def test_memory_rule_of_thumb():
    # 7B over 4 trainer ranks: (2 + 8) * 7 / 4 = 17.5 GB; vLLM TP 2: 2 * 7 / 2 = 7 GB per GPU.
    cfg = make_config(trainer_num_workers=4, inference_tensor_parallel_size=2)
    est = memory_estimate(cfg, 7e9)
    assert est["trainer_gb_per_gpu"] == pytest.approx(17.5)
    assert est["vllm_weights_gb_per_gpu"] == pytest.approx(7.0)


def test_doctor_reports_the_machine(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in ("python", "torch", "gpu", "vLLM", "bubblewrap", "ray", "trainers", "quickstart"):
        assert key in out


def test_doctor_with_a_config_estimates_memory(tmp_path, capsys, tiny_model_dir):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"model: {tiny_model_dir}\ninference_num_workers: 1\ntrainer_num_workers: 1\n"
        "eval_num_servers: 0\nenvironments: [{name: countdown}]\n"
    )
    assert main(["doctor", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "B parameters" in out
    assert "per rank" in out


def test_doctor_with_a_bad_config_fails_cleanly(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("learning_rat: 1\n")
    assert main(["doctor", "--config", str(cfg)]) == 1
    assert "learning_rat" in capsys.readouterr().err


def test_convert_rejects_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert main(["convert", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "meta.json" in capsys.readouterr().err
