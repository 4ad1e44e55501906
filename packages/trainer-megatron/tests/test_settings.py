"""Impossible megatron_* combinations are all reported, each with a fix; the CPU shim is reversible."""

from __future__ import annotations

import pytest
import torch
from megatron_families import family_config

import telescope_config
from telescope_trainer_megatron import (
    Architecture,
    ParallelLayout,
    check_megatron_settings,
    megatron_problems,
)


def _config(**overrides):
    data = {**telescope_config.defaults(), "environments": [{"name": "countdown"}], "model": "m", **overrides}
    data["train_backend"] = "megatron"
    return telescope_config.TelescopeConfig.model_validate(data)


LLAMA = Architecture.from_dict(family_config("llama").to_dict())  # 4 heads, 2 kv heads, 2 layers
MOE = Architecture.from_dict(family_config("mixtral").to_dict())  # 4 experts


def _problems(arch=LLAMA, world=2, has_te=False, has_cuda=False, **overrides):
    cfg = _config(**overrides)
    return megatron_problems(
        cfg, arch, ParallelLayout.from_config(cfg, world), has_te=has_te, has_cuda=has_cuda
    )


def test_defaults_are_fine_on_cpu():
    assert _problems() == []
    assert _problems(megatron_tensor_parallel_size=2) == []


@pytest.mark.parametrize(
    ("overrides", "arch", "world", "fragment"),
    [
        ({"megatron_tensor_parallel_size": 3}, LLAMA, 3, "must divide the attention heads"),
        ({"megatron_tensor_parallel_size": 2}, LLAMA, 3, "must be divisible"),
        ({"megatron_pipeline_parallel_size": 4}, LLAMA, 4, "must divide the number of layers"),
        ({"megatron_expert_parallel_size": 2}, LLAMA, 2, "has no experts"),
        ({"megatron_expert_parallel_size": 3}, MOE, 3, "must divide the experts"),
        ({"megatron_context_parallel_size": 2}, LLAMA, 2, "needs Transformer Engine"),
        ({"megatron_use_transformer_engine": True}, LLAMA, 1, "not installed"),
        ({"megatron_fp8": True}, LLAMA, 1, "needs megatron_use_transformer_engine"),
        (
            {"megatron_use_precision_aware_optimizer": True, "megatron_use_distributed_optimizer": False},
            LLAMA,
            1,
            "needs megatron_use_distributed_optimizer",
        ),
        ({"megatron_exp_avg_dtype": "bfloat16"}, LLAMA, 1, "only takes effect"),
        ({"megatron_overlap_grad_reduce": True}, LLAMA, 1, "CUDA streams"),
        ({"megatron_optimizer_cpu_offload": True}, LLAMA, 1, "already there"),
    ],
)
def test_each_impossible_combination_is_reported(overrides, arch, world, fragment):
    problems = _problems(arch=arch, world=world, **overrides)
    assert any(fragment in p for p in problems), problems


def test_check_raises_all_problems_at_once():
    cfg = _config(megatron_tensor_parallel_size=3, megatron_fp8=True)
    with pytest.raises(ValueError, match="cannot work") as info:
        check_megatron_settings(cfg, LLAMA, ParallelLayout.from_config(cfg, 3), has_te=False, has_cuda=False)
    assert "attention heads" in str(info.value)
    assert "megatron_fp8" in str(info.value)


@pytest.mark.filterwarnings("ignore:Transformer Engine and Apex:UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cpu_shim_is_reversible_and_a_no_op_with_cuda(monkeypatch):
    from telescope_trainer_megatron import install_cpu_shim, uninstall_cpu_shim
    from telescope_trainer_megatron._cpu_shim import cpu_shim_active, cuda_type_names

    original = torch.cuda.current_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert install_cpu_shim() is False
    assert not cpu_shim_active()
    monkeypatch.undo()
    was_active = cpu_shim_active()
    try:
        assert install_cpu_shim() is True
        assert torch.cuda.current_device() == "cpu"
        from megatron.core.optimizer import optimizer as mopt

        assert mopt.torch.zeros(2, device="cuda").device.type == "cpu"
        t = torch.zeros(1)
        with cuda_type_names():
            assert t.type() == "torch.cuda.FloatTensor"
        assert t.type() == "torch.FloatTensor"
    finally:
        if not was_active:
            uninstall_cpu_shim()
    if not was_active:
        assert torch.cuda.current_device is original
