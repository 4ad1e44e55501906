from pathlib import Path

from telescope_cli._presets import QUICKSTART, default_run_config


def test_local_run_yaml_wins_over_the_quickstart(tmp_path: Path):
    assert default_run_config(tmp_path) == QUICKSTART
    (tmp_path / "configs").mkdir()
    run = tmp_path / "configs" / "run.yaml"
    run.write_text("environments: [{name: countdown}]\n")
    assert default_run_config(tmp_path) == run


def test_quickstart_preset_is_a_valid_config():
    from telescope_config import load_config

    resolved = load_config(QUICKSTART)
    cfg = resolved.config
    assert cfg.inference_num_workers == 1
    assert cfg.trainer_num_workers == 1
    assert [e.name for e in cfg.environments] == ["quickstart_add"]
    assert cfg.max_tokens < cfg.max_model_len <= cfg.seq_len
