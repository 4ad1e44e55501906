"""Command-line overrides: the accepted spellings, value coercion, dotted paths and every bad flag."""

from __future__ import annotations

import pytest

from telescope_config import ConfigError, parse_overrides


@pytest.mark.parametrize(
    "args",
    [
        ["--learning_rate", "5e-7"],
        ["--learning_rate=5e-7"],
        ["--learning-rate", "5e-7"],
        ["--learning-rate=5e-7"],
        ["--Learning-Rate", "5e-7"],
        ["--LEARNING_RATE=5e-7"],
    ],
)
def test_spellings_of_one_override(args):
    assert parse_overrides(args) == {"learning_rate": 5e-7}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2", 2),  # JSON int
        ("-1", -1),  # a negative value is a value, not a flag
        ("0.25", 0.25),
        ("1e-6", 1e-6),
        ("true", True),
        ("false", False),
        ("null", None),
        ("1_000", 1000),  # not JSON, but int() takes it
        ("inf", float("inf")),  # not JSON, not int, but float() takes it
        ("grpo", "grpo"),  # left as text
        ("", ""),
    ],
)
def test_values_are_coerced_json_then_int_then_float_then_text(raw, expected):
    assert parse_overrides([f"--max_off_policy_steps={raw}"]) == {"max_off_policy_steps": expected}


def test_json_lists_and_dicts():
    got = parse_overrides(
        ["--environments", '[{"name": "countdown", "weight": 2}]', "--wandb_tags", '["a","b"]']
    )
    assert got == {"environments": [{"name": "countdown", "weight": 2}], "wandb_tags": ["a", "b"]}


def test_free_text_fields_keep_the_text_as_typed():
    got = parse_overrides(["--wandb_run_name", "2024", "--model", "1e-3", "--checkpoint_dir", "null"])
    assert got == {"wandb_run_name": "2024", "model": "1e-3", "checkpoint_dir": None}


def test_bare_flag_of_a_bool_field_means_true():
    assert parse_overrides(["--debug"]) == {"debug": True}
    assert parse_overrides(["--debug", "--use-wandb", "--seq_len", "8"]) == {
        "debug": True,
        "use_wandb": True,
        "seq_len": 8,
    }
    assert parse_overrides(["--debug", "false"]) == {"debug": False}


def test_dotted_path_into_a_dict_field_keeps_the_case_below_the_field():
    got = parse_overrides(["--Ray-Runtime-Env.env_vars.FOO", "bar", "--ray_runtime_env.env_vars.N=1"])
    assert got == {"ray_runtime_env": {"env_vars": {"FOO": "bar", "N": 1}}}


def test_later_flags_win():
    assert parse_overrides(["--seq_len", "8", "--seq-len=16"]) == {"seq_len": 16}
    got = parse_overrides(["--ray_runtime_env", '{"a": 1}', "--ray_runtime_env.b", "2"])
    assert got == {"ray_runtime_env": {"a": 1, "b": 2}}


def test_no_args_no_overrides():
    assert parse_overrides([]) == {}


def _problems(args):
    with pytest.raises(ConfigError) as info:
        parse_overrides(args)
    return info.value.problems


def test_unknown_flag_suggests_the_field():
    [p] = _problems(["--learning_rat", "1e-6"])
    assert p.field == "learning_rat"
    assert p.value == "1e-6"
    assert p.source == "--learning_rat"
    assert "unknown flag" in p.rule
    assert "'learning_rate'" in p.fix


@pytest.mark.parametrize("token", ["stray", "-x", "--", "learning_rate=1"])
def test_a_token_that_is_not_a_flag(token):
    [p] = _problems([token])
    assert p.value == token
    assert "start with --" in p.rule
    assert "--name value" in p.fix


def test_a_non_bool_flag_needs_a_value():
    [p] = _problems(["--seq_len"])
    assert p.field == "seq_len"
    assert "needs a value" in p.rule
    assert "--seq_len VALUE" in p.fix


@pytest.mark.parametrize("args", [["--learning_rate.x", "1"], ["--environments.0.weight", "2"]])
def test_dotted_path_into_a_non_dict_field(args):
    [p] = _problems(args)
    assert "is not a dict" in p.rule
    assert "ray_runtime_env" in p.fix


def test_dotted_path_with_an_empty_key():
    [p] = _problems(["--ray_runtime_env..x", "1"])
    assert "non-empty keys" in p.rule


def test_every_bad_flag_is_reported_at_once():
    found = _problems(["--nope", "1", "stray", "--seq_len", "8", "--model_dtyp", "float16", "--max_tokens"])
    assert [p.field for p in found] == ["nope", "stray", "model_dtyp", "max_tokens"]
    assert str(ConfigError(found)).startswith("4 problems in ")
