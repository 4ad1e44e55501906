"""ExecResult and the heuristics that name the limit which ended a program."""

from __future__ import annotations

import signal

import pytest

from telescope_sandbox import (
    ExecResult,
    SandboxCPULimitError,
    SandboxDiskLimitError,
    SandboxLimitError,
    SandboxMemoryError,
    SandboxOutputLimitError,
    SandboxTimeoutError,
)
from telescope_sandbox._result import classify_end


def test_ok_only_for_clean_exit():
    assert ExecResult(stdout="1\n", stderr="", exit_code=0).ok
    assert not ExecResult(stdout="", stderr="boom", exit_code=1).ok
    assert not ExecResult(stdout="", stderr="", exit_code=0, timed_out=True).ok
    assert not ExecResult(stdout="", stderr="", exit_code=-9).ok
    assert not ExecResult(stdout="", stderr="", exit_code=0, killed_by="output").ok


@pytest.mark.parametrize(
    ("killed_by", "error"),
    [
        ("timeout", SandboxTimeoutError),
        ("cpu", SandboxCPULimitError),
        ("memory", SandboxMemoryError),
        ("output", SandboxOutputLimitError),
        ("disk", SandboxDiskLimitError),
    ],
)
def test_raise_for_limit(killed_by, error):
    result = ExecResult(stdout="", stderr="", exit_code=-9, killed_by=killed_by)
    with pytest.raises(error) as info:
        result.raise_for_limit()
    assert info.value.result is result
    assert isinstance(info.value, SandboxLimitError)


def test_raise_for_limit_passes_program_failures():
    crashed = ExecResult(stdout="", stderr="", exit_code=-11, killed_by="signal")
    assert crashed.raise_for_limit() is crashed
    assert issubclass(SandboxCPULimitError, SandboxTimeoutError)


def _classify(*, exit_code=0, stderr="", timed_out=False, output_killed=False, cpu=None, cpu_limit=11):
    return classify_end(
        exit_code=exit_code,
        stderr_tail=stderr,
        timed_out=timed_out,
        output_killed=output_killed,
        cpu_time_s=cpu,
        cpu_limit_s=cpu_limit,
    )


def test_classify_end():
    assert _classify() is None
    assert _classify(exit_code=1, stderr="Traceback ...\nValueError") is None
    assert _classify(exit_code=-9, timed_out=True) == "timeout"
    assert _classify(exit_code=-9, output_killed=True, timed_out=True) == "output"
    assert _classify(exit_code=-signal.SIGXCPU) == "cpu"
    assert _classify(exit_code=-9, cpu=12.0) == "cpu"  # hard RLIMIT_CPU sends SIGKILL
    assert _classify(exit_code=-9, cpu=0.1) == "signal"
    assert _classify(exit_code=-signal.SIGXFSZ) == "disk"
    assert _classify(exit_code=1, stderr="Traceback ...\nMemoryError\n") == "memory"
    assert _classify(exit_code=1, stderr="OSError: [Errno 28] No space left on device") == "disk"
    assert _classify(exit_code=152, stderr="main.sh: line 1: 7 CPU time limit exceeded") == "cpu"
    assert _classify(exit_code=0, stderr="MemoryError") is None  # a clean exit is never a kill
    assert _classify(exit_code=-11) == "signal"
