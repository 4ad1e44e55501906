"""Which run config a command uses when the user gives no ``--config``.

``./configs/run.yaml`` when it exists, else the packaged
quickstart preset, so that ``telescope train`` with no arguments runs the CPU quickstart.
"""

from __future__ import annotations

from pathlib import Path

PRESETS = Path(__file__).parent / "presets"
QUICKSTART = PRESETS / "quickstart.yaml"
LOCAL_RUN_CONFIG = Path("configs") / "run.yaml"


def default_run_config(cwd: Path | None = None) -> Path:
    """The run config to use when ``--config`` is absent."""
    local = (cwd or Path.cwd()) / LOCAL_RUN_CONFIG
    return local if local.is_file() else QUICKSTART
