import subprocess
import sys


def test_envs_list_shows_every_builtin_environment():
    res = subprocess.run(
        [sys.executable, "-m", "telescope_cli", "envs", "list"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    builtins = ["countdown", "hendrycks_math", "dapo_math", "deepscaler", "wordle", "i3_code"]
    builtins += ["quickstart_add", "quickstart_agent", "quickstart_agent_command"]
    for name in builtins:
        assert name in res.stdout
    assert "multi" in res.stdout  # wordle is multi-turn
