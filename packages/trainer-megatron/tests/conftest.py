"""Make this folder's helper modules (megatron_families, megatron_spawn) importable by the tests,
and build the tiny tensor-parallel-ready model they share."""

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def tiny_tp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with 4 heads and 2 KV heads (hidden 128): splits over TP = 2 and CP = 2."""
    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("_tiny_model_megatron", root / "tools" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_model(tmp_path_factory.mktemp("tiny_tp"), heads=4, kv_heads=2, hidden=128)
