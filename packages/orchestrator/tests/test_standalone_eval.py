"""``telescope eval`` (``telescope_orchestrator.evaluate``): which checkpoints it finds, where their
results go, which config it takes, what it refuses (the evaluation itself, through the command:
tests/test_e2e_train.py)."""

from __future__ import annotations

import json

import pytest

from telescope_config import ConfigError
from telescope_orchestrator import EvalError, evaluate
from telescope_orchestrator.run.standalone_eval import find_checkpoints, run_dir_of


def _run_with_checkpoints(tmp_path, steps=(2, 4)):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: x\n")
    for step in steps:
        folder = run / "checkpoints" / f"step_{step}"
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps({"step": step, "backend": "fsdp"}))
    return run


def test_a_folder_of_checkpoints_gives_each_by_step_and_its_run(tmp_path):
    run = _run_with_checkpoints(tmp_path, steps=(10, 2))
    (run / "checkpoints" / "step_3.tmp").mkdir()  # unfinished: no meta.json
    found = find_checkpoints([str(run / "checkpoints")])
    assert [(c.step, c.native) for c in found] == [(2, True), (10, True)]
    assert run_dir_of(found, None) == run
    assert run_dir_of(found, str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"


def test_a_hugging_face_folder_takes_its_step_from_its_name(tmp_path):
    hf = tmp_path / "exports" / "step_7"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (found,) = find_checkpoints([str(hf)])
    assert (found.step, found.native) == (7, False)
    with pytest.raises(EvalError, match="--run-dir"):
        run_dir_of([found], None)


def test_folders_without_checkpoints_are_refused_with_the_fix(tmp_path):
    with pytest.raises(EvalError, match=r"holds no checkpoint: a checkpoint has meta\.json"):
        find_checkpoints([str(tmp_path)])
    with pytest.raises(EvalError, match="is not a folder"):
        find_checkpoints([str(tmp_path / "missing")])


def test_the_runs_own_config_is_taken_and_one_without_evals_is_refused_before_anything_starts(tmp_path):
    run = _run_with_checkpoints(tmp_path)
    (run / "config.yaml").write_text("environments: [{name: countdown}]\n")
    with pytest.raises(EvalError, match="lists no evals: add `evals` to it"):
        evaluate([run / "checkpoints"])
    with pytest.raises(EvalError, match="lists no evals"):  # one path alone: the same
        evaluate(str(run / "checkpoints"))
    (run / "config.yaml").write_text("environments: [{name: countdown}]\nnumber_of_stepz: 3\n")
    with pytest.raises(ConfigError, match="number_of_stepz"):  # it was read
        evaluate([run / "checkpoints"])


def test_a_config_given_or_by_default_is_taken_when_the_run_has_none(tmp_path):
    hf = tmp_path / "step_3"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    out = tmp_path / "out"
    with pytest.raises(EvalError, match=r"has no config\.yaml: pass the run's config"):
        evaluate([hf], run_dir=out)
    default = tmp_path / "default.yaml"
    default.write_text("environments: [{name: countdown}]\nevalz: []\n")
    with pytest.raises(ConfigError, match="evalz"):
        evaluate([hf], run_dir=out, default_config=default)
    with pytest.raises(EvalError, match="lists no evals"):  # the given config wins over the default
        evaluate([hf], {"environments": [{"name": "countdown"}]}, run_dir=out, default_config=default)


def test_checkpoints_share_a_server_when_their_config_differs_only_in_name_and_dtype(tmp_path):
    from telescope_orchestrator.run.standalone_eval import _architecture

    def folder(name: str, **config: object):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return path

    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}
    a = folder("a", **base, _name_or_path="/x", torch_dtype="float32", transformers_version="4.57")
    b = folder("b", **base, _name_or_path="/y", dtype="bfloat16", transformers_version="5.0")
    wider = folder("c", **{**base, "hidden_size": 128})
    assert _architecture(a) == _architecture(b) == base
    assert _architecture(wider) != _architecture(a)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("[1]")
    with pytest.raises(EvalError, match="not a JSON object"):
        _architecture(tmp_path / "d")
