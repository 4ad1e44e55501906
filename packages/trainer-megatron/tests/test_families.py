"""Every supported family builds as a Megatron model whose packed logits equal transformers' (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from megatron_families import FAMILIES, build_family
from megatron_spawn import free_port

WORKER = Path(__file__).with_name("family_worker.py")


@pytest.mark.slow
def test_families_build_load_and_match_transformers(tmp_path: Path):
    dirs = [str(build_family(name, tmp_path)) for name in FAMILIES]
    dirs.append(str(build_family("qwen3", tmp_path, tied=True)))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"models": dirs, "out": str(tmp_path / "out.pt")}))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    for d in dirs:
        # fp32; logits of order 1: summation order differs, nothing else may
        assert out[d]["max_diff"] < 1e-5, (d, out[d])
