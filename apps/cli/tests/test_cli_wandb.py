"""W&B logging: offline mode works with no network and never asks for a login."""

from __future__ import annotations

import pytest

from telescope_cli._presets import QUICKSTART
from telescope_cli._rundir import RunDir
from telescope_cli._train import _start_wandb, _wandb_mode


def test_mode_follows_credentials(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert _wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert _wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _wandb_mode() == "disabled"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_offline_run_records_metrics_in_the_run_directory(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb", reason="install telescope-cli[wandb]")
    from telescope_config import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    resolved = load_config(QUICKSTART, ["--use_wandb", "true", "--wandb_run_name", "offline_test"])
    run = RunDir(tmp_path / "run")
    wb = _start_wandb(resolved.config, resolved, run)
    try:
        assert wb.settings.mode == "offline"
        wb.log({"reward/mean": 0.25, "loss": 0.5}, step=1)
    finally:
        wb.finish()
    offline = list((run.path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb")), "no W&B record written"
    assert wandb.run is None
