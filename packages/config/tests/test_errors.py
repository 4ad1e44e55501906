"""Every way a config can be wrong ends in one ConfigError that names field, value, rule and fix."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from telescope_config import ConfigError, Problem, defaults, load_config

ENV = "environments: [{name: countdown}]\n"


def _problems(path=None, overrides=(), **kwargs) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, **kwargs)
    return info.value.problems


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    [p] = _problems(path)
    assert p.value == str(path)
    assert p.rule == "file not found"
    assert str(path) in p.fix
    assert p.source == str(path)


def test_directory_instead_of_file(tmp_path):
    [p] = _problems(tmp_path)
    assert "directory" in p.rule
    assert ".yaml file" in p.fix


@pytest.mark.parametrize(
    ("error", "words"),
    [(PermissionError(13, "Permission denied"), "permission denied"), (OSError(5, "I/O error"), "I/O error")],
)
def test_read_errors_become_problems(write, monkeypatch, error, words):
    path = write(ENV)

    def fail(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(Path, "read_text", fail)
    [p] = _problems(path)
    assert words in p.rule
    assert p.value == str(path)


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model: caf\xe9\n".encode("latin-1"))
    [p] = _problems(path)
    assert "UTF-8" in p.rule


def test_bad_yaml_names_the_line(write):
    path = write(ENV + "learning_rate: 1.0e-6\nwandb_tags: [a, b\nseq_len: 4096\n")
    [p] = _problems(path)
    assert p.field == "<file>"
    assert "YAML syntax error at line" in p.rule
    line = int(p.rule.split("at line ")[1].split(",")[0])
    assert line in (3, 4)  # the unclosed bracket opens on line 3; the parser notices on line 4
    assert f"near line {line}" in p.fix


def test_bad_indentation_names_the_line(write):
    [p] = _problems(write("environments:\n  - name: countdown\n   weight: 2\n"))
    assert "line 3" in p.rule


def test_duplicate_key_is_an_error_with_its_line(write):
    [p] = _problems(write(ENV + "seq_len: 4096\nseq_len: 8192\n"))
    assert "'seq_len' appears twice" in p.rule
    assert "line 3" in p.rule


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just text\n", "str"), ("42\n", "int")])
def test_top_level_must_be_a_mapping(write, text, kind):
    [p] = _problems(write(text))
    assert p.value == f"a {kind}"
    assert "mapping" in p.rule
    assert "field: value" in p.fix


def test_non_text_keys(write):
    [p] = _problems(write(ENV + "1: one\n"))
    assert p.field == "1"
    assert "field names" in p.rule


def test_unsafe_yaml_tags_are_refused_not_run(write):
    [p] = _problems(write("!!python/object/apply:os.system ['echo hi']\n"))
    assert "YAML" in p.rule


def test_unknown_key_suggests_the_right_one(write):
    [p] = _problems(write(ENV + "learning_rat: 1.0e-6\n"))
    assert p.field == "learning_rat"
    assert p.value == 1e-6
    assert "unknown config field" in p.rule
    assert "did you mean 'learning_rate'?" in p.fix


def test_unknown_key_without_a_close_match(write):
    [p] = _problems(write(ENV + "zzzz: 1\n"))
    assert "did you mean" not in p.fix
    assert "telescope config show" in p.fix


def test_unknown_keys_inside_entries(write):
    text = "environments: [{name: countdown, wieght: 2}]\nevals: [{name: math500, evel_every: 5}]\n"
    found = _problems(write(text))
    assert {p.field for p in found} == {"environments[0].wieght", "evals[0].evel_every"}
    fixes = {p.field: p.fix for p in found}
    assert "'weight'" in fixes["environments[0].wieght"]
    assert "'eval_every'" in fixes["evals[0].evel_every"]


def test_an_entry_needs_a_name(write):
    [p] = _problems(write("environments: [{weight: 2}]\n"))
    assert p.field == "environments[0].name"
    assert p.rule == "this key is required"
    assert "Registered name" in p.fix


def test_wrong_type(write):
    [p] = _problems(write(ENV + "seq_len: lots\n"))
    assert (p.field, p.value) == ("seq_len", "lots")
    assert "valid integer" in p.rule
    assert "default: 4096" in p.fix


def test_text_field_given_a_number_says_to_quote_it(write):
    [p] = _problems(write(ENV + "wandb_run_name: 2024\n"))
    assert "string" in p.rule
    assert 'wandb_run_name: "2024"' in p.fix


def test_out_of_range(write):
    [p] = _problems(write(ENV + "learning_rate: -1\n"))
    assert (p.field, p.value) == ("learning_rate", -1)
    assert "greater than 0" in p.rule
    assert "a value greater than 0" in p.fix
    assert "default: 1e-06" in p.fix


def test_bad_choice_suggests_a_close_one(write):
    [p] = _problems(write(ENV + "algorithm: reinforce++\n"))
    assert "'grpo'" in p.rule
    assert "'reinforce_pp'" in p.fix


def test_bad_choice_without_a_close_one_lists_the_choices(write):
    [p] = _problems(write(ENV + "lr_scheduler: zigzag\n"))
    assert p.fix == "choose one of: none, constant, linear, cosine"


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("evals: [{name: x, pass_k: [0, 2]}]\n", "evals[0].pass_k", "integer >= 1"),
        ("evals: [{name: x, pass_k: {at_k: [1]}}]\n", "evals[0].pass_k", "mapping with keys"),
        ("evals: [{name: x, pass_k: {pass_at: {}}}]\n", "evals[0].pass_k", "unknown pass_k kind"),
        ("evals: [{name: x, pass_k: 3}]\n", "evals[0].pass_k", "list of k values"),
        ("evals: [{name: x, pass_k: {at_k: {k: [2.5]}}}]\n", "evals[0].pass_k", "at_k.k must be an integer"),
        ("evals: [{name: x, pass_k: {at_k: {k: '12'}}}]\n", "evals[0].pass_k", "at_k.k must be an integer"),
        ("evals: [{name: x, pass_k: {pow_k: {k: []}}}]\n", "evals[0].pass_k", "pow_k.k must be an integer"),
        ("evals: [{name: x, pass_k: {at_k: {metrics: [1]}}}]\n", "evals[0].pass_k", "at_k.metrics must"),
        ("evals: [{name: x, num_samples: 0}]\n", "evals[0].num_samples", "empty eval"),
        ("evals: [{name: x, num_samples: -2}]\n", "evals[0].num_samples", "greater than or equal to -1"),
        ("evals: [{name: x, eval_every: 0}]\n", "evals[0].eval_every", "greater than or equal to 1"),
        ("evals: [{name: x, top_p: 1.5}]\n", "evals[0].top_p", "less than or equal to 1"),
        ("environments: [{name: countdown, weight: 0}]\n", "environments[0].weight", "greater than 0"),
    ],
)
def test_bad_entry_values(write, text, field, words):
    body = text if text.startswith("environments") else ENV + text
    found = _problems(write(body))
    assert [p.field for p in found] == [field]
    assert words in found[0].rule


def test_all_problems_of_a_file_are_reported_together(write):
    text = (
        "environments: [{name: countdown, wieght: 2}]\n"
        "learning_rat: 1.0e-6\n"
        "temperature: 0\n"
        "seq_len: lots\n"
        "checkpoint_every: true\n"
        "max_tokens: 5000\n"
    )
    path = write(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, ["--group_size=0", "--nope", "1"])
    err = info.value
    fields = [p.field for p in err.problems]
    assert sorted(fields) == sorted(
        [
            "nope",  # bad flag
            "environments[0].wieght",  # unknown key in an entry
            "learning_rat",  # unknown key
            "temperature",  # out of range
            "seq_len",  # wrong type
            "checkpoint_every",  # custom field rule
            "group_size",  # out of range, from the command line
            "max_tokens",  # cross-field rule, still checked
        ]
    )
    sources = {p.field: p.source for p in err.problems}
    assert sources["group_size"] == "--group_size"
    assert sources["temperature"] == str(path)
    report = str(err)
    assert report.startswith(f"8 problems in {path} and the command line:")
    for p in err.problems:
        assert p.field in report
        assert p.rule in report
        assert p.fix in report


def test_problem_format_and_error_report():
    p = Problem("seq_len", "lots", "must be a valid integer", "use a valid integer", "run.yaml")
    assert p.format() == (
        "seq_len = 'lots'  (from run.yaml)\n    rule: must be a valid integer\n    fix:  use a valid integer"
    )
    err = ConfigError([p], "run.yaml")
    assert str(err).splitlines()[0] == "1 problem in run.yaml:"
    assert "1. seq_len = 'lots'" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == [p]
    assert str(again) == str(err)


def test_long_values_are_shortened_in_the_report():
    p = Problem("chat_template", "x" * 500, "r", "f", "run.yaml")
    assert len(p.format().splitlines()[0]) < 120


def test_a_custom_defaults_file_missing_a_key(write):
    partial = defaults()
    del partial["seq_len"]
    found = _problems(
        defaults_path=write(yaml.safe_dump(partial)), overrides=["--environments", '[{"name": "x"}]']
    )
    [p] = found
    assert (p.field, p.rule, p.source) == ("seq_len", "this key is required", "defaults")


def test_a_missing_custom_defaults_file(tmp_path):
    [p] = _problems(defaults_path=tmp_path / "none.yaml")
    assert (p.rule, p.source) == ("file not found", "defaults")


def test_a_file_problem_and_a_flag_problem_together(tmp_path):
    found = _problems(tmp_path / "nope.yaml", ["--nope", "1"])
    assert [p.field for p in found] == ["<file>", "nope"] or [p.field for p in found] == ["nope", "<file>"]


@pytest.mark.parametrize(
    "text",
    [
        "environments: 5\n",
        "environments: [5]\n",
        "environments: [{name: [a]}]\n",
        "environments: [{name: a, kwargs: [1]}]\n",
        "evals: {name: x}\n",
        ENV + "ray_runtime_env: [1]\n",
        ENV + "wandb_tags: {a: 1}\n",
        ENV + "wandb_tags: [[1]]\n",
        ENV + "learning_rate: .nan\n",
        ENV + "checkpoint_every: 1.5\n",
        ENV + "resume_from_checkpoint: [1]\n",
        ENV + "model: null\n",
        ENV + "inference_num_workers: 0\n",
        ENV + "inference_tensor_parallel_size: 0\n",
        ENV + "a: &x [*x]\n",
        "? [a]\n: 1\n",
        "---\na: 1\n---\nb: 2\n",
        "\t- tab\n",
    ],
)
def test_odd_input_never_escapes_as_another_exception(write, text):
    with pytest.raises(ConfigError) as info:
        load_config(write(text))
    assert info.value.problems
    assert str(info.value)
