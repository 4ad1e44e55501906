"""Without megatron-core the backend says how to get it: an ImportError that names the ``[megatron]`` extra.

A fresh interpreter hides megatron-core (``sys.modules["megatron"] = None``, which makes every
``import megatron…`` fail as if it were not installed). Importing the package still works (a plain
process converts checkpoints without it); building a trainer, installing the CPU shim and importing
the attention built on megatron-core's classes raise the ImportError.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

INSTALL = "pip install 'telescope-trainer-megatron[megatron]'"

CODE = """
import sys
sys.modules["megatron"] = None
import torch
import telescope_trainer_megatron as tm

calls = {
    "create_trainer": lambda: tm.create_trainer(None),
    "attention": lambda: __import__("telescope_trainer_megatron._attention"),
}
if not torch.cuda.is_available():  # with CUDA the shim is a no-op that needs nothing
    calls["install_cpu_shim"] = tm.install_cpu_shim
for name, call in calls.items():
    try:
        call()
    except ImportError as exc:
        print(name, "ImportError", exc)
    else:
        print(name, "no error")
"""


def test_the_extra_is_megatron_core():
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(dep.startswith("megatron-core") for dep in extras["megatron"])


def test_missing_megatron_core_raises_an_import_error_naming_the_extra():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300, check=True
    )
    lines = out.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines][:2] == ["create_trainer", "attention"]
    for line in lines:
        assert line.split()[1] == "ImportError", line
        assert INSTALL in line, line
