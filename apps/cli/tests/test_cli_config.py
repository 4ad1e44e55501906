"""The ``telescope`` command as a user runs it: a subprocess, exit codes, stdout and stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest


def telescope(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "telescope_cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_help_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from telescope_cli.main import build_parser\n"
        "build_parser().format_help()\n"
        "heavy = {'torch', 'vllm', 'transformers', 'ray', 'pydantic', 'telescope_config'}\n"
        "heavy &= set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    res = telescope("--help")
    assert res.returncode == 0
    assert "config" in res.stdout


def test_show_marks_user_keys(tmp_path: Path):
    run = tmp_path / "run.yaml"
    run.write_text("environments:\n  - name: countdown\nlearning_rate: 3.0e-6\n")
    res = telescope("config", "show", "--config", str(run), "--group-size=4")
    assert res.returncode == 0, res.stderr
    lines = {ln.split(":")[0]: ln for ln in res.stdout.splitlines() if ln and not ln.startswith(" ")}
    assert "3.0e-06" in lines["learning_rate"] or "3e-06" in lines["learning_rate"]
    assert "#" in lines["learning_rate"]  # user-set: marked
    assert lines["group_size"].split("#")[0].strip() == "group_size: 4"
    assert "#" in lines["group_size"]
    assert "#" not in lines["seq_len"]  # a default: not marked
    unmarked = telescope("config", "show", "--config", str(run), "--no-marks")
    assert unmarked.returncode == 0
    assert all("#" not in ln for ln in unmarked.stdout.splitlines() if ln.startswith("learning_rate"))


def test_validate_exit_codes(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text("environments:\n  - name: countdown\n")
    assert telescope("config", "validate", "--config", str(good)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("environments:\n  - name: countdown\nlearning_rat: 1e-6\ntemperature: 0\n")
    res = telescope("config", "validate", "--config", str(bad))
    assert res.returncode == 1
    assert "learning_rate" in res.stderr  # the did-you-mean suggestion
    assert "temperature" in res.stderr  # both problems reported at once
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("content", "args"),
    [
        (None, ("--config", "does-not-exist.yaml")),
        ("environments: [\n  - name: x\n", ()),  # broken YAML
        ("- just\n- a list\n", ()),
        ("environments:\n  - name: countdown\n", ("--no_such_field", "1")),
        ("environments:\n  - name: countdown\n", ("--seq_len", "lots")),
        ("environments:\n  - name: countdown\n", ("stray-positional",)),
    ],
)
def test_bad_input_never_shows_a_traceback(tmp_path: Path, content, args):
    cfg_args: tuple[str, ...] = ()
    if content is not None:
        f = tmp_path / "run.yaml"
        f.write_text(content)
        cfg_args = ("--config", str(f))
    res = telescope("config", "validate", *cfg_args, *args, cwd=tmp_path)
    assert res.returncode in (1, 2)
    assert "Traceback" not in res.stderr
    assert res.stderr.strip()


def test_schema_is_json_schema_for_run_files():
    res = telescope("config", "schema")
    assert res.returncode == 0
    schema = json.loads(res.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "learning_rate" in schema["properties"]
    jsonschema.validate({"learning_rate": 1e-6, "environments": [{"name": "countdown"}]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"learning_rat": 1e-6}, schema)


def test_internal_errors_are_reported_without_traceback(monkeypatch, capsys):
    from telescope_cli import main as main_mod
    from telescope_cli._exit import EXIT_INTERNAL

    def boom(args, parser):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(main_mod, "_dispatch", boom)
    assert main_mod.main(["config", "schema"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "simulated bug" in err
    assert "--debug" in err


def test_no_config_uses_the_quickstart(tmp_path: Path):
    res = telescope("config", "show", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "quickstart_add" in res.stdout
    res = telescope("config", "validate", "--seq_len", "64", cwd=tmp_path)
    assert res.returncode == 1  # the override breaks seq_len >= max_model_len
    assert "seq_len" in res.stderr


def test_logging_survives_a_replaced_stderr(capsys):
    """Library log lines after the CLI configured logging must not write to a stale stream."""
    import io
    import sys

    import structlog

    from telescope_orchestrator.record.logging import configure_logging

    old = sys.stderr
    sys.stderr = io.StringIO()
    configure_logging()
    sys.stderr.close()  # the stream the CLI saw is gone (like a test's captured stderr)
    sys.stderr = old
    structlog.get_logger().info("still fine")
    assert "still fine" in capsys.readouterr().err
