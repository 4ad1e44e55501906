"""Limits: validation with messages that say the bound, and the rlimits they become."""

from __future__ import annotations

import pytest

from telescope_sandbox import Limits, SandboxRequestError


def test_defaults_and_rlimits():
    limits = Limits()
    assert limits.cpu_seconds == 11  # timeout_s + 1
    rl = {name: (soft, hard) for name, soft, hard in limits.rlimits()}
    assert rl["RLIMIT_CPU"] == (11, 12)
    assert rl["RLIMIT_AS"] == (512 << 20, 512 << 20)
    assert rl["RLIMIT_NPROC"] == (64, 64)
    assert rl["RLIMIT_NOFILE"] == (256, 256)
    assert rl["RLIMIT_FSIZE"] == (64 << 20, 64 << 20)
    assert rl["RLIMIT_CORE"] == (0, 0)
    assert Limits(timeout_s=0.2).cpu_seconds == 2
    assert Limits(cpu_time_s=0.3).cpu_seconds == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be a number"),
        ({"memory_mb": 8}, "memory_mb must be >= 16"),
        ({"max_processes": 0}, "max_processes must be >= 1"),
        ({"disk_mb": True}, "disk_mb must be a number"),
        ({"cpu_time_s": -1}, "cpu_time_s must be > 0 or None"),
        ({"cpu_time_s": True}, "cpu_time_s must be > 0 or None"),
        ({"max_output_bytes": "1"}, "max_output_bytes must be a number"),
    ],
)
def test_bad_limits(kwargs, message):
    with pytest.raises(SandboxRequestError, match=message):
        Limits(**kwargs)
    assert isinstance(SandboxRequestError("x"), ValueError)
