"""The processes the run starts as ``python -m telescope_orchestrator.cluster.<module>`` start
without a warning (a root that imported them first made ``runpy`` print one on every run's
console), and the root's public names resolve on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import telescope_orchestrator


@pytest.mark.parametrize("module", ["guard", "reaper"])
def test_a_cluster_entry_point_starts_without_a_warning(module: str):
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", f"telescope_orchestrator.cluster.{module}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m telescope_orchestrator.cluster." in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr


def test_importing_the_root_imports_no_run_module():
    code = "import sys, telescope_orchestrator as t; print(sorted(m for m in sys.modules if t.__name__ in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "['telescope_orchestrator', 'telescope_orchestrator.__about__']"


def test_every_public_name_resolves_and_an_unknown_one_is_an_attribute_error():
    for name in telescope_orchestrator.__all__:
        assert getattr(telescope_orchestrator, name) is not None, name
    assert set(telescope_orchestrator.__all__) <= set(dir(telescope_orchestrator))
    assert telescope_orchestrator.train.__module__ == "telescope_orchestrator.run.api"
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        telescope_orchestrator.trian  # noqa: B018
