"""The ``telescope.sandboxes`` entry-point group: lookup by name, unknown names list the known ones."""

from __future__ import annotations

import pytest

from telescope_sandbox import LocalSandbox, SandboxRequestError, available_sandboxes, get_sandbox


def test_local_is_registered():
    assert "local" in available_sandboxes()


def test_get_sandbox_builds_with_kwargs(sandbox: LocalSandbox):
    built = get_sandbox("local", isolation="none")
    assert isinstance(built, LocalSandbox)
    assert built.isolation == "none"


def test_unknown_name_lists_known_ones():
    with pytest.raises(SandboxRequestError, match=r"unknown sandbox provider 'nope'; known: .*local"):
        get_sandbox("nope")
