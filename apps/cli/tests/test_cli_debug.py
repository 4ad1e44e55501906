"""``telescope train --debug``, ``telescope --debug train`` and ``debug: true`` are one debug mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope_cli import main as main_mod
from telescope_cli._exit import EXIT_INTERNAL, EXIT_INVALID, EXIT_OK
from telescope_cli._presets import QUICKSTART
from telescope_orchestrator.run import checks as _checks


@pytest.mark.parametrize(
    ("argv", "top", "flag"),
    [
        (["train"], False, None),
        (["train", "--debug"], False, True),
        (["train", "--debug", "true"], False, True),
        (["train", "--debug=false"], False, False),
        (["train", "--debug", "off"], False, False),
        (["--debug", "train"], True, None),
    ],
)
def test_debug_flag_parsing(argv, top, flag):
    args, extras = main_mod.build_parser().parse_known_args(argv)
    assert (args.debug, args.train_debug, extras) == (top, flag, [])


def test_debug_flag_leaves_config_and_overrides_alone():
    argv = ["train", "--debug", "--config", "run.yaml", "--learning_rate", "1e-6", "--run-dir", "r"]
    args, extras = main_mod.build_parser().parse_known_args(argv)
    assert args.train_debug is True
    assert args.config == "run.yaml"
    assert args.run_dir == "r"
    assert extras == ["--learning_rate", "1e-6"]


def test_debug_flag_rejects_a_non_boolean(capsys):
    with pytest.raises(SystemExit):
        main_mod.build_parser().parse_known_args(["train", "--debug", "maybe"])
    assert "expected true or false" in capsys.readouterr().err


@pytest.fixture
def recorded(monkeypatch, tmp_path: Path) -> list[dict]:
    """Stand in for the job: record what ``train`` got instead of starting Ray and vLLM."""
    import telescope_orchestrator as train_mod

    calls: list[dict] = []

    def fake_train(resolved, *, reporter, run_dir=None, debug=False):
        quiet = not reporter.enabled
        calls.append({"debug": debug, "config_debug": resolved.config.debug, "quiet": quiet})
        return tmp_path

    monkeypatch.setattr(train_mod, "train", fake_train)
    monkeypatch.setattr(_checks, "cpu_torch_conflict", lambda: None)
    monkeypatch.chdir(tmp_path)  # no ./configs/run.yaml: the packaged quickstart
    return calls


def _config_with_debug(tmp_path: Path, value: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(QUICKSTART.read_text() + f"\ndebug: {value}\n")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "debug"),
    [
        (["train"], False),
        (["train", "--debug"], True),
        (["train", "--quiet", "--debug"], True),
        (["--debug", "train"], True),
        (["--debug", "train", "--debug", "false"], False),
        (["train", "--Debug"], True),  # the config override form still works
    ],
)
def test_the_flag_reaches_train_and_the_config(recorded, argv, debug):
    assert main_mod.main(argv) == EXIT_OK
    assert recorded[-1]["debug"] is debug
    assert recorded[-1]["config_debug"] is debug


def test_debug_true_in_the_config_is_debug_mode(recorded, tmp_path):
    config = _config_with_debug(tmp_path, "true")
    assert main_mod.main(["train", "--config", config]) == EXIT_OK
    assert recorded[-1] == {"debug": True, "config_debug": True, "quiet": False}
    assert main_mod.main(["train", "--config", config, "--debug", "false"]) == EXIT_OK
    assert recorded[-1]["debug"] is False


def test_debug_in_the_config_shows_internal_tracebacks(monkeypatch, tmp_path, capsys):
    import telescope_orchestrator as train_mod

    def boom(resolved, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(train_mod, "train", boom)
    monkeypatch.setattr(_checks, "cpu_torch_conflict", lambda: None)
    assert main_mod.main(["train", "--config", _config_with_debug(tmp_path, "false")]) == EXIT_INTERNAL
    assert "simulated bug" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="simulated bug"):
        main_mod.main(["train", "--config", _config_with_debug(tmp_path, "true")])


def _fake_versions(monkeypatch, versions: dict[str, str]) -> None:
    import importlib.metadata

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.parametrize(
    ("versions", "flagged"),
    [
        ({"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.11.1"}, True),
        ({"torch": "2.13.0+cpu", "torchaudio": "2.11.1"}, True),
        ({"torch": "2.13.0+cpu", "torchcodec": "0.17.0"}, False),  # vLLM and transformers import
        ({"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu"}, False),  # the CPU build fits
        ({"torch": "2.13.0", "torchvision": "0.28.0"}, False),  # CUDA torch: PyPI's builds fit
        ({"torch": "2.13.0+cpu"}, False),
    ],
)
def test_pypi_torchvision_beside_the_cpu_torch_is_found(monkeypatch, versions, flagged):
    _fake_versions(monkeypatch, versions)
    problem = _checks.cpu_torch_conflict()
    assert (problem is not None) is flagged
    if flagged:
        assert problem is not None
        assert "pip uninstall -y torchvision torchaudio torchcodec" in problem
        assert "torchaudio 2.11.1" in problem


def test_train_stops_before_starting_anything_on_a_broken_torch_stack(monkeypatch, tmp_path, capsys):
    import telescope_orchestrator.run.startup as train_mod

    monkeypatch.setattr(train_mod, "train", lambda *a, **k: pytest.fail("the job must not start"))
    monkeypatch.chdir(tmp_path)
    _fake_versions(monkeypatch, {"torch": "2.13.0+cpu", "torchvision": "0.28.0"})
    assert main_mod.main(["train"]) == EXIT_INVALID
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("telescope train: torchvision 0.28.0 (PyPI's build) beside torch 2.13.0+cpu")
    assert last.endswith("(in this repository: hatch run fix-env)")
