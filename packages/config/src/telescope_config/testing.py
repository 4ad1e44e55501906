"""Configs for tests: ``make_config(**fields)``, a valid ``TelescopeConfig`` in one call.

The packaged defaults, one ``countdown`` environment (a run needs one), then ``fields``, validated
as a run YAML with those keys would be (the cross-field rules included). Tests of every package
use it instead of hand-built stand-ins, so a renamed or removed field fails them.
"""

from __future__ import annotations

from typing import Any

from telescope_config._schema import TelescopeConfig
from telescope_config._yaml import defaults

__all__ = ["make_config"]


def make_config(**fields: Any) -> TelescopeConfig:
    """The defaults with ``environments: [{name: countdown}]`` and ``fields`` on top, validated."""
    values: dict[str, Any] = {**defaults(), "environments": [{"name": "countdown"}], **fields}
    return TelescopeConfig.model_validate(values)
