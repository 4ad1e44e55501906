"""The JSON Schema for editors: run YAML files validate, bad ones do not."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from telescope_config import defaults, json_schema

HERE = Path(__file__).parent
EXAMPLES = sorted((HERE.parents[2] / "configs" / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_field_is_optional_documented_and_has_its_default():
    schema = json_schema()
    assert "required" not in schema
    assert schema["additionalProperties"] is False
    assert list(schema["properties"]) == list(defaults())
    for name, prop in schema["properties"].items():
        assert prop["description"], name
        assert prop["default"] == defaults()[name], name
    for entry in ("EnvironmentEntry", "EvalEntry"):
        assert schema["$defs"][entry]["additionalProperties"] is False
        assert schema["$defs"][entry]["required"] == ["name"]


@pytest.mark.parametrize("path", [*EXAMPLES, HERE / "data" / "upstream_run.yaml"], ids=lambda p: p.stem)
def test_example_configs_validate(validator, path):
    validator.validate(yaml.safe_load(path.read_text()))


def test_the_defaults_themselves_validate_once_an_environment_is_added(validator):
    validator.validate(defaults() | {"environments": [{"name": "countdown"}]})


@pytest.mark.parametrize(
    "bad",
    [
        {"learning_rat": 1e-6},
        {"learning_rate": "fast"},
        {"learning_rate": 0},
        {"algorithm": "ppo"},
        {"checkpoint_every": True},
        {"checkpoint_every": -1},
        {"resume_from_checkpoint": 0},
        {"temperature": 0},
        {"environments": []},
        {"environments": [{"weight": 1.0}]},
        {"environments": [{"name": "countdown", "wieght": 1.0}]},
        {"evals": [{"name": "math500", "pass_k": {"pass_at": {}}}]},
        {"wandb_tags": "telescope"},
    ],
)
def test_bad_run_files_fail(validator, bad):
    assert not validator.is_valid(bad)


def test_example_list_is_complete():
    names = {p.stem for p in EXAMPLES}
    assert names == {
        "countdown",
        "hendrycks_math",
        "hendrycks_math_with_eval",
        "dapo_math",
        "deepscaler",
        "wordle",
        "i3_code",
        "quickstart_agent",
        "agent_command",
        "distill",
    }
