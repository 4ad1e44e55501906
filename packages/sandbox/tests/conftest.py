"""Shared fixtures: a LocalSandbox, an error (never a skip) where bubblewrap is missing.

Every environment that runs these tests (``hatch test``, ``hatch run pkg.sandbox:test``, CI) is
meant to have bubblewrap: a missing ``bwrap`` is a broken set-up, so the tests that need it fail
with the command that fixes it.
"""

from __future__ import annotations

import shutil

import pytest

from telescope_sandbox import LocalSandbox

MISSING_BWRAP = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"


@pytest.fixture
def sandbox() -> LocalSandbox:
    if shutil.which("bwrap") is None:
        pytest.fail(MISSING_BWRAP, pytrace=False)
    return LocalSandbox()
