"""Slim packages stay slim as users install them: built wheels in a fresh venv, no torch.

The workspace environments hold every package at once, so a stray import of torch could hide
there; this test builds the wheels of config, rollout, sandbox, records and the inspector (ui), installs
only them (and their declared dependencies) into a new virtual environment and imports them.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLIM = ("packages/config", "packages/rollout", "packages/sandbox", "packages/records", "apps/ui")


@pytest.mark.slow
def test_slim_wheels_install_and_import_without_heavy_packages(tmp_path: Path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(wheels),
            *(str(ROOT / p) for p in SLIM),
        ],
        check=True,
        timeout=600,
    )
    built = sorted(wheels.glob("*.whl"))
    assert len(built) == len(SLIM)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", *map(str, built)], check=True, timeout=600)
    code = (
        "import sys, tempfile, telescope_config, telescope_rollout, telescope_sandbox, telescope_records\n"
        "w = telescope_records.RecordWriter(tempfile.mkdtemp())\n"
        "assert w.write_step('samples', 1, [{'step': 1, 'reward': 1.0}]).is_file()\n"
        "from telescope_config import load_config\n"
        "from telescope_rollout import get_environment\n"
        "env = get_environment('countdown', dataset='bundled')\n"
        "assert len(env.load_dataset()) > 0\n"
        "assert load_config(None, ['--environments', '[{\"name\": \"countdown\"}]']).config.group_size == 8\n"
        "import pathlib, telescope_ui\n"
        "from telescope_ui.testing import synthetic_run\n"
        "run = synthetic_run(pathlib.Path(tempfile.mkdtemp()) / 'r', steps=1)\n"
        "telescope_ui.create_app([run.parent])\n"
        "assert (pathlib.Path(telescope_ui.__file__).parent / 'static' / 'app.js').is_file()\n"
        "print(sorted({'torch', 'vllm', 'transformers'} & set(sys.modules)))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    installed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    for heavy in ("torch==", "vllm", "transformers=="):
        assert heavy not in installed
