"""``telescope eval``: bad input is a message and exit code 1 (the evaluation itself:
packages/orchestrator/tests/test_standalone_eval.py)."""

from __future__ import annotations

from telescope_cli.main import main


def test_the_command_exits_1_with_the_message(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 1
    assert "telescope eval:" in capsys.readouterr().err
