"""Importing telescope_config stays light: no torch, vllm, transformers or sibling packages."""

from __future__ import annotations

import subprocess
import sys

import telescope_config


def test_import_loads_nothing_heavy():
    code = (
        "import sys, telescope_config\n"
        "heavy = {'torch', 'vllm', 'transformers', 'ray', 'numpy'} & set(sys.modules)\n"
        "siblings = {m for m in sys.modules\n"
        "            if m.startswith('telescope_') and not m.startswith('telescope_config')}\n"
        "print(sorted(heavy | siblings))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_public_api():
    assert set(telescope_config.__all__) == {
        "ConfigError",
        "EnvironmentEntry",
        "EvalEntry",
        "Problem",
        "ResolvedConfig",
        "TelescopeConfig",
        "__version__",
        "defaults",
        "json_schema",
        "load_config",
        "num_inference_servers",
        "parse_overrides",
    }
    for name in telescope_config.__all__:
        assert getattr(telescope_config, name) is not None
