"""Shared fixtures: a LocalSandbox, skipped where bubblewrap is missing."""

from __future__ import annotations

import shutil

import pytest

from telescope_sandbox import LocalSandbox


@pytest.fixture
def sandbox() -> LocalSandbox:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    return LocalSandbox()
