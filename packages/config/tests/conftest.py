"""Shared fixtures: write a run YAML, load it, and collect the problems of a bad one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from telescope_config import ConfigError, Problem, ResolvedConfig, load_config

COUNTDOWN = [{"name": "countdown"}]


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str], Path]:
    """Write YAML text to a fresh file and return its path."""
    counter = iter(range(1_000))

    def _write(text: str) -> Path:
        path = tmp_path / f"run{next(counter)}.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture
def run(write: Callable[[str], Path]) -> Callable[..., ResolvedConfig]:
    """Load a run YAML made of ``values`` (with one environment unless given) plus overrides."""

    def _run(values: dict[str, Any] | None = None, *overrides: str) -> ResolvedConfig:
        data = {"environments": COUNTDOWN, **(values or {})}
        return load_config(write(yaml.safe_dump(data)), overrides)

    return _run


@pytest.fixture
def problems(run: Callable[..., ResolvedConfig]) -> Callable[..., list[Problem]]:
    """The problems of a run YAML that must fail."""

    def _problems(values: dict[str, Any] | None = None, *overrides: str) -> list[Problem]:
        with pytest.raises(ConfigError) as info:
            run(values, *overrides)
        return info.value.problems

    return _problems


@pytest.fixture
def only() -> Callable[[list[Problem], str], Problem]:
    """The single problem reported against a field."""

    def _only(found: list[Problem], field: str) -> Problem:
        matching = [p for p in found if p.field == field]
        assert len(matching) == 1, f"expected one problem for {field}, got {found}"
        return matching[0]

    return _only
