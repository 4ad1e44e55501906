"""The three layers (defaults, run YAML, overrides): precedence, merging, user keys, YAML output."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest
import yaml

from telescope_config import ConfigError, ResolvedConfig, TelescopeConfig, defaults, load_config

ENV = '[{"name": "countdown"}]'


def test_defaults_fill_every_field_the_user_left_out(write):
    path = write("environments: [{name: countdown}]\n")
    resolved = load_config(path)
    values = resolved.to_dict()
    assert list(values) == list(defaults())
    for key, value in defaults().items():
        if key != "environments":
            assert values[key] == value, key
    assert resolved.user_keys == {"environments"}
    assert resolved.sources == ("defaults", str(path))
    assert resolved.notes == ()


def test_file_beats_defaults_and_overrides_beat_the_file(write):
    path = write("environments: [{name: countdown}]\nlearning_rate: 3.0e-6\ngroup_size: 4\n")
    resolved = load_config(path, ["--group-size=16"])
    assert resolved.config.learning_rate == 3e-6  # file over defaults (1e-6)
    assert resolved.config.group_size == 16  # command line over file
    assert resolved.config.seq_len == 4096  # untouched default
    assert resolved.sources == ("defaults", str(path), "command line")
    assert resolved.user_keys == {"environments", "learning_rate", "group_size"}


def test_overrides_alone_without_a_file():
    resolved = load_config(None, ["--environments", ENV, "--number_of_steps", "5"])
    assert resolved.config.number_of_steps == 5
    assert resolved.config.environments[0].name == "countdown"
    assert resolved.sources == ("defaults", "command line")
    assert resolved.user_keys == {"environments", "number_of_steps"}


def test_dicts_deep_merge_across_layers(write):
    path = write(
        "environments: [{name: countdown}]\n"
        "ray_runtime_env: {working_dir: /src, env_vars: {A: '1', B: '2'}}\n"
    )
    cfg = load_config(path, ["--ray_runtime_env.env_vars.B", "two", "--ray_runtime_env.env_vars.C=3"]).config
    assert cfg.ray_runtime_env == {"working_dir": "/src", "env_vars": {"A": "1", "B": "two", "C": 3}}


def test_dotted_override_into_a_null_default_starts_a_dict():
    cfg = load_config(None, ["--environments", ENV, "--ray_runtime_env.env_vars.FOO", "bar"]).config
    assert cfg.ray_runtime_env == {"env_vars": {"FOO": "bar"}}


def test_lists_replace_instead_of_merging(write):
    path = write("environments: [{name: countdown}, {name: wordle, weight: 2}]\nwandb_tags: [a, b]\n")
    cfg = load_config(path, ["--wandb_tags", '["c"]', "--environments", '[{"name": "gsm8k"}]']).config
    assert cfg.wandb_tags == ["c"]
    assert [e.name for e in cfg.environments] == ["gsm8k"]
    # and the file's list replaces the default list
    assert load_config(path).config.wandb_tags == ["a", "b"]


def test_a_file_may_set_a_key_to_its_default_and_still_counts_as_user_set(write):
    resolved = load_config(write("environments: [{name: countdown}]\nseq_len: 4096\n"))
    assert "seq_len" in resolved.user_keys


def test_an_empty_file_is_all_defaults(write):
    resolved = load_config(write(""), ["--environments", ENV])
    assert resolved.user_keys == {"environments"}


def test_a_custom_defaults_file(write):
    custom = defaults() | {"group_size": 3, "environments": [{"name": "countdown"}]}
    resolved = load_config(defaults_path=write(yaml.safe_dump(custom)))
    assert resolved.config.group_size == 3
    assert resolved.user_keys == frozenset()


def test_entry_defaults_are_filled_in(write):
    cfg = load_config(write("environments: [{name: countdown}]\nevals: [{name: math500}]\n")).config
    env, ev = cfg.environments[0], cfg.evals[0]
    assert (env.weight, env.reward_min, env.reward_max, env.kwargs) == (1.0, None, None, {})
    assert (ev.eval_every, ev.pass_k, ev.num_samples, ev.separate_eval_samples) == (10, {}, -1, False)
    assert (ev.temperature, ev.top_p, ev.max_tokens, ev.kwargs) == (None, None, None, {})


def test_pass_k_takes_a_bare_list_or_a_mapping(write):
    text = (
        "environments: [{name: countdown}]\n"
        "evals:\n"
        "  - {name: a, pass_k: [1, 4, 8]}\n"
        "  - {name: b, pass_k: {at_k: {metrics: [correct], k: [1, 4]}, pow_k: {k: [2]}}}\n"
    )
    a, b = load_config(write(text)).config.evals
    assert a.pass_k == [1, 4, 8]
    assert b.pass_k == {"at_k": {"metrics": ["correct"], "k": [1, 4]}, "pow_k": {"k": [2]}}


def test_yaml_floats_without_a_dot_are_floats(write):
    # PyYAML alone reads 1e-6 as text; our loader reads it as YAML 1.2 does
    cfg = load_config(write("environments: [{name: countdown}]\nray_runtime_env: {x: 1e-6}\n")).config
    assert cfg.ray_runtime_env == {"x": 1e-6}


def test_resolved_config_and_model_are_frozen():
    resolved = load_config(None, ["--environments", ENV])
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.user_keys = frozenset()  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        resolved.config.seq_len = 1


def _key_lines(text: str) -> dict[str, str]:
    return {ln.split(":")[0]: ln for ln in text.splitlines() if ln and ln[0].isalpha()}


def test_to_yaml_round_trips_in_defaults_order_and_marks_user_keys(write):
    path = write("environments: [{name: countdown, kwargs: {a: 1}}]\nlearning_rate: 3.0e-6\n")
    resolved = load_config(path, ["--group-size", "4"])
    text = resolved.to_yaml()
    assert yaml.safe_load(text) == resolved.to_dict()
    lines = _key_lines(text)
    assert list(lines) == list(defaults())
    marked = {key for key, line in lines.items() if line.endswith("# set by you")}
    assert marked == {"environments", "learning_rate", "group_size"}
    assert lines["group_size"] == "group_size: 4  # set by you"
    assert str(path) in text.splitlines()[0]
    plain = resolved.to_yaml(mark_user_keys=False)
    assert "# set by you" not in plain
    assert yaml.safe_load(plain) == resolved.to_dict()


def test_to_yaml_keeps_a_multi_line_user_value_valid(write):
    template = "{% for m in messages %}\n{{ m['content'] }}\n{% endfor %}"
    resolved = load_config(None, ["--environments", ENV, "--chat_template", template])
    text = resolved.to_yaml()
    assert yaml.safe_load(text)["chat_template"] == template
    assert sum(ln.endswith("# set by you") for ln in text.splitlines()) == 2


def test_to_yaml_lists_the_notes():
    resolved = load_config(None, ["--environments", ENV, "--algorithm", "reinforce_pp"])
    assert "# Note: advantage_norm switched" in resolved.to_yaml()


def test_to_dict_is_plain_data_that_validates_again():
    resolved = load_config(None, ["--environments", ENV])
    data = resolved.to_dict()
    assert TelescopeConfig.model_validate(data) == resolved.config
    assert isinstance(resolved, ResolvedConfig)


def test_python_values_sit_between_the_file_and_the_command_line(write):
    path = write("environments: [{name: countdown}]\nlearning_rate: 3.0e-6\ngroup_size: 4\n")
    values = {"group_size": 8, "number_of_steps": 7, "ray_runtime_env": {"env_vars": {"A": "1"}}}
    resolved = load_config(path, ["--number_of_steps", "9"], values=values)
    assert resolved.config.learning_rate == 3e-6  # the file, untouched by the values
    assert resolved.config.group_size == 8  # the values over the file
    assert resolved.config.number_of_steps == 9  # the command line over the values
    assert resolved.config.ray_runtime_env == {"env_vars": {"A": "1"}}
    assert resolved.sources == ("defaults", str(path), "the Python values", "command line")
    keys = {"environments", "learning_rate", "group_size", "number_of_steps", "ray_runtime_env"}
    assert resolved.user_keys == keys


def test_python_values_alone_and_their_mistakes_named_by_their_source():
    resolved = load_config(values={"environments": [{"name": "countdown"}], "number_of_steps": 3})
    assert resolved.config.number_of_steps == 3
    assert resolved.sources == ("defaults", "the Python values")
    with pytest.raises(ConfigError) as bad:
        load_config(values={"environments": [{"name": "countdown"}], "lerning_rate": 1e-5})
    [problem] = bad.value.problems
    assert problem.field == "lerning_rate"
    assert problem.source == "the Python values"
    assert "learning_rate" in problem.fix
    assert "the Python values" in str(bad.value)


@pytest.mark.parametrize("values", [["model", "x"], {1: "x"}, "model: x"])
def test_values_that_are_not_a_mapping_of_names_are_one_problem(values):
    with pytest.raises(ConfigError) as bad:
        load_config(values=values)
    [problem] = bad.value.problems
    assert problem.rule == "the values must be a mapping of field names (strings) to values"
    assert "pass a dict" in problem.fix


def test_make_config_is_the_defaults_with_an_environment_and_the_fields_given():
    from telescope_config.testing import make_config

    cfg = make_config(group_size=4, learning_rate=2e-6)
    assert (cfg.group_size, cfg.learning_rate) == (4, 2e-6)
    assert [e.name for e in cfg.environments] == ["countdown"]
    assert cfg.seq_len == defaults()["seq_len"]
    with pytest.raises(pydantic.ValidationError, match="lerning_rate"):
        make_config(lerning_rate=1e-5)  # a misspelled field fails the test that used it
