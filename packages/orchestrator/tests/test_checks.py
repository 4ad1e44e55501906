"""Start-up checks: a backend without its extra, and top-p meeting trainer-vs-server comparisons."""

from __future__ import annotations

import importlib.util

from telescope_config import TelescopeConfig
from telescope_config.testing import make_config
from telescope_orchestrator.run import checks as _checks


def test_installed_backends_pass_and_unknown_ones_list_the_installed():
    assert _checks.backend_problem("fsdp") is None
    problem = _checks.backend_problem("deepspeed")
    assert problem is not None
    assert "installed: fsdp, megatron" in problem


def test_megatron_needs_megatron_core_and_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    present = {"megatron": True}

    def find_spec(name, *args):
        if name == "megatron":
            return object() if present["megatron"] else None
        return real(name, *args)

    monkeypatch.setattr(_checks.importlib.util, "find_spec", find_spec)
    assert _checks.backend_problem("megatron") is None
    present["megatron"] = False
    problem = _checks.backend_problem("megatron")
    assert problem is not None
    assert "pip install 'telescope-trainer-megatron[megatron]'" in problem


def test_lora_without_peft_names_the_extra(monkeypatch):
    real = _checks.importlib.util.find_spec
    present = {"peft": True}

    def find_spec(name, *args):
        if name == "peft":
            return object() if present["peft"] else None
        return real(name, *args)

    monkeypatch.setattr(_checks.importlib.util, "find_spec", find_spec)
    assert _checks.backend_problem("fsdp", lora=True) is None
    present["peft"] = False
    assert _checks.backend_problem("fsdp") is None  # no LoRA: PEFT is not needed
    problem = _checks.backend_problem("fsdp", lora=True)
    assert problem is not None
    assert "pip install 'telescope-trainer-fsdp[lora]'" in problem


def _config(**over) -> TelescopeConfig:
    return make_config(**over)


def test_top_p_warns_only_with_a_term_that_compares_logprobs():
    assert _checks.truncated_sampling_warning(_config(use_tis=True)) is None  # top_p null
    assert _checks.truncated_sampling_warning(_config(top_p=0.9)) is None  # nothing compares
    warning = _checks.truncated_sampling_warning(_config(top_p=0.9, use_tis=True, kl_penalty_tau=0.1))
    assert warning is not None
    assert "use_tis, kl_penalty_tau" in warning
    assert "top_p: null" in warning
    # a ratio against the trainer's own pre-update logprobs compares nothing with the servers
    assert (
        _checks.truncated_sampling_warning(
            _config(top_p=0.9, use_ppo_clip=True, ppo_clip_ref_logprobs="batch")
        )
        is None
    )
    gspo = _checks.truncated_sampling_warning(_config(top_p=0.9, algorithm="gspo"))
    assert gspo is not None
    assert "the gspo ratio compare" in gspo


def test_a_teacher_or_reference_at_another_temperature_warns():
    assert _checks.frozen_model_temperature_warning(_config(temperature=0.7)) is None  # neither
    assert _checks.frozen_model_temperature_warning(_config(ref_kl_coef=0.1)) is None  # at 1.0
    warning = _checks.frozen_model_temperature_warning(_config(ref_kl_coef=0.1, temperature=0.7))
    assert warning is not None
    assert "temperature is 0.7" in warning
    assert "ref_kl_coef" in warning
    assert "temperature: 1.0" in warning


def test_a_placement_in_the_trainer_without_its_model_warns():
    assert _checks.unused_placement_warning(_config(ref_kl_coef=0.1, ref_placement="trainer")) is None
    warning = _checks.unused_placement_warning(_config(teacher_placement="trainer", ref_placement="trainer"))
    assert warning is not None
    assert warning.startswith("teacher_placement: trainer and ref_placement: trainer place(s) a model")
    assert "algorithm: opd with a teacher_model" in warning
    assert _checks.unused_placement_warning(_config()) is None  # servers, the default: nothing to say
