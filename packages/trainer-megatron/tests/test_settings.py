"""Model- and machine-dependent Megatron problems are all reported with a fix; the dtype follows the config;
the CPU shim is reversible. (The config-only rules are tested in packages/config.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from megatron_families import family_config

from telescope_config import ConfigError
from telescope_config.testing import make_config
from telescope_trainer_megatron import (
    Architecture,
    ParallelLayout,
    check_megatron_settings,
    megatron_problems,
    params_dtype_name,
)


def _config(**overrides):
    return make_config(**{"model": "m", **overrides, "train_backend": "megatron"})


LLAMA = Architecture.from_dict(family_config("llama").to_dict())  # 4 heads, 2 kv heads, 2 layers
MOE = Architecture.from_dict(family_config("mixtral").to_dict())  # 4 experts


def _problems(arch=LLAMA, world=None, has_te=False, has_cuda=False, **overrides):
    cfg = _config(**overrides)
    layout = ParallelLayout.from_config(cfg, cfg.trainer_num_workers if world is None else world)
    return megatron_problems(cfg, arch, layout, has_te=has_te, has_cuda=has_cuda)


def test_defaults_are_fine_on_cpu():
    assert _problems() == []
    assert _problems(megatron_tensor_parallel_size=2) == []
    assert _problems(MOE, megatron_expert_parallel_size=2) == []
    moe_tp = {"megatron_tensor_parallel_size": 2, "megatron_use_transformer_engine": True}
    assert _problems(MOE, has_te=True, megatron_sequence_parallel=True, **moe_tp) == []


@pytest.mark.parametrize(
    ("overrides", "arch", "field", "source", "fragment"),
    [
        (
            {"trainer_num_workers": 3, "megatron_tensor_parallel_size": 3},
            LLAMA,
            "megatron_tensor_parallel_size",
            "config.json",
            "heads (4) and key/value heads (2)",
        ),
        (
            {"trainer_num_workers": 4, "megatron_pipeline_parallel_size": 4},
            LLAMA,
            "megatron_pipeline_parallel_size",
            "config.json",
            "layers (2)",
        ),
        (
            {"megatron_expert_parallel_size": 2},
            LLAMA,
            "megatron_expert_parallel_size",
            "config.json",
            "no experts",
        ),
        (
            {"trainer_num_workers": 3, "megatron_expert_parallel_size": 3},
            MOE,
            "megatron_expert_parallel_size",
            "config.json",
            "experts (4)",
        ),
        (
            {"trainer_num_workers": 2, "megatron_tensor_parallel_size": 2},
            MOE,
            "megatron_tensor_parallel_size",
            "config.json",
            "only with sequence parallelism",
        ),
        (
            {"megatron_use_transformer_engine": True},
            LLAMA,
            "megatron_use_transformer_engine",
            "machine",
            "not installed",
        ),
        (
            {"megatron_fp8": True, "megatron_use_transformer_engine": True},
            LLAMA,
            "megatron_fp8",
            "machine",
            "CUDA",
        ),
        (
            {"megatron_overlap_grad_reduce": True},
            LLAMA,
            "megatron_overlap_grad_reduce",
            "machine",
            "CUDA streams",
        ),
        (
            {"megatron_optimizer_cpu_offload": True},
            LLAMA,
            "megatron_optimizer_cpu_offload",
            "machine",
            "already there",
        ),
    ],
)
def test_each_model_or_machine_problem_is_reported(overrides, arch, field, source, fragment):
    [p] = [p for p in _problems(arch=arch, **overrides) if p.field == field]
    assert p.value == overrides[field]
    assert fragment in p.rule
    assert source in p.source
    assert p.fix


def test_world_must_match_trainer_num_workers():
    [p] = _problems(world=4, trainer_num_workers=2)
    assert (p.field, p.value) == ("trainer_num_workers", 2)
    assert "4 ranks" in p.rule
    assert "trainer_num_workers: 4" in p.fix


def test_with_cuda_and_te_the_machine_problems_go_away():
    values: dict[str, Any] = {
        "megatron_fp8": True,
        "megatron_use_transformer_engine": True,
        "megatron_overlap_grad_reduce": True,
        "megatron_optimizer_cpu_offload": True,
    }
    assert len(_problems(**values)) == 4
    assert _problems(has_te=True, has_cuda=True, **values) == []


def test_check_raises_all_problems_at_once():
    cfg = _config(trainer_num_workers=3, megatron_tensor_parallel_size=3, megatron_overlap_grad_reduce=True)
    with pytest.raises(ConfigError, match="2 problems in the Megatron settings") as info:
        check_megatron_settings(cfg, LLAMA, ParallelLayout.from_config(cfg, 3), has_te=False, has_cuda=False)
    assert {p.field for p in info.value.problems} == {
        "megatron_tensor_parallel_size",
        "megatron_overlap_grad_reduce",
    }
    assert "fix:" in str(info.value)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "bfloat16"),  # defaults: float32 master weights, bfloat16 compute
        ({"mixed_precision_dtype": None}, "float32"),
        ({"mixed_precision_dtype": None, "model_dtype": "bfloat16"}, "bfloat16"),
        ({"mixed_precision_dtype": "float32", "model_dtype": "bfloat16"}, "float32"),
    ],
)
def test_params_dtype_follows_the_config(values, expected):
    assert params_dtype_name(_config(**values)) == expected


def test_params_dtype_refuses_float16():
    # The Megatron config rules reject float16 already; a default-backend config reaches the function.
    cfg = make_config(model="m", mixed_precision_dtype="float16", model_dtype="float32")
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        params_dtype_name(cfg)


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


@pytest.mark.filterwarnings("ignore:Transformer Engine and Apex:UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cpu_shim_runs_the_alltoall_dispatchers_host_copy_without_streams():
    import numpy as np
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as Dispatcher

    from telescope_trainer_megatron import install_cpu_shim, uninstall_cpu_shim
    from telescope_trainer_megatron._cpu_shim import cpu_shim_active

    original = Dispatcher._maybe_dtoh_and_synchronize
    was_active = cpu_shim_active()
    try:
        install_cpu_shim()
        assert Dispatcher.cuda_dtoh_stream is not None  # so __init__ makes no torch.cuda.Stream
        tokens = torch.tensor([4, 0])
        fake: Any = SimpleNamespace(
            drop_and_pad=False,
            cuda_dtoh_point="before_permutation_1",
            input_splits=torch.tensor([3, 1]),
            output_splits=torch.tensor([2, 5]),
            output_splits_tp=None,
        )
        # Not the copy point: nothing changes.
        assert Dispatcher._maybe_dtoh_and_synchronize(fake, "before_finish", tokens) is tokens
        assert torch.is_tensor(fake.input_splits)
        # The copy point: split sizes become host arrays (what the CUDA path makes of them).
        assert Dispatcher._maybe_dtoh_and_synchronize(fake, "before_permutation_1", tokens) is tokens
        assert isinstance(fake.input_splits, np.ndarray)
        assert fake.input_splits.tolist() == [3, 1]
        assert fake.output_splits.tolist() == [2, 5]
        assert fake.output_splits_tp is None
    finally:
        if not was_active:
            uninstall_cpu_shim()
    if not was_active:
        assert Dispatcher._maybe_dtoh_and_synchronize is original
        assert Dispatcher.cuda_dtoh_stream is None


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_cpu_shim_rope_slice_is_megatrons_zigzag():
    from telescope_trainer_megatron._cpu_shim import _cpu_pos_emb_on_this_cp_rank

    # Megatron's get_pos_emb_on_this_cp_rank: view [2cp, L/2cp], index_select [r, 2cp-1-r]
    emb = torch.arange(8.0).view(8, 1, 1, 1)
    assert _cpu_pos_emb_on_this_cp_rank(emb, 0, _Group(2, 0)).flatten().tolist() == [0, 1, 6, 7]
    assert _cpu_pos_emb_on_this_cp_rank(emb, 0, _Group(2, 1)).flatten().tolist() == [2, 3, 4, 5]
