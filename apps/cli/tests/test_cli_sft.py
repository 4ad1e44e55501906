"""``telescope sft``: every step of the config supervised (``sft_steps`` set to ``number_of_steps``),
run by the same job as ``telescope train``; a config without conversations, or one that asks for RL
steps after its supervised ones, is refused with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope_cli import main as main_mod
from telescope_cli._exit import EXIT_INVALID, EXIT_OK
from telescope_orchestrator.run import checks as _checks


@pytest.fixture
def recorded(monkeypatch, tmp_path: Path) -> list:
    """Stand in for the job: keep the resolved config ``train`` got instead of starting Ray."""
    import telescope_orchestrator as train_mod

    calls: list = []
    monkeypatch.setattr(train_mod, "train", lambda resolved, **kw: calls.append(resolved.config))
    monkeypatch.setattr(_checks, "cpu_torch_conflict", lambda: None)
    monkeypatch.chdir(tmp_path)  # no ./configs/run.yaml: the packaged quickstart
    return calls


def test_every_step_is_supervised(recorded, tmp_path):
    data = tmp_path / "chats.jsonl"
    assert main_mod.main(["sft", "--sft_dataset", str(data), "--number_of_steps", "7", "--quiet"]) == EXIT_OK
    (cfg,) = recorded
    assert (cfg.sft_steps, cfg.number_of_steps, cfg.sft_dataset) == (7, 7, str(data))
    assert cfg.supervised_only


def test_equal_sft_steps_given_by_the_user_are_fine(recorded):
    argv = ["sft", "--sft_dataset", "d.jsonl", "--number_of_steps", "5", "--sft_steps", "5", "--quiet"]
    assert main_mod.main(argv) == EXIT_OK
    assert recorded[0].sft_steps == 5


def test_no_conversations_is_refused_with_the_flag_to_give(recorded, capsys):
    assert main_mod.main(["sft", "--quiet"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith("telescope sft: no sft_dataset to train on. Give one with --sft_dataset")
    assert "Traceback" not in err
    assert recorded == []


def test_a_config_with_rl_steps_after_its_supervised_ones_is_sent_to_train(recorded, capsys):
    argv = ["sft", "--sft_dataset", "d.jsonl", "--number_of_steps", "6", "--sft_steps", "2", "--quiet"]
    assert main_mod.main(argv) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "sets sft_steps: 2 of number_of_steps: 6" in err
    assert "run it with telescope train, or set number_of_steps to 2" in err
    assert recorded == []


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main_mod.main(["--help"])
    assert "supervised fine-tuning only" in capsys.readouterr().out
