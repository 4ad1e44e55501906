"""The Python API's pieces that need no cluster: resolving each kind of config, the reporter that
hands each step to ``on_step`` and turns ``StopTraining`` into a stop request, and the silent
reporter (the whole run from Python: tests/test_e2e_python_api.py)."""

from __future__ import annotations

import pytest

from telescope_config import ConfigError, TelescopeConfig, load_config
from telescope_orchestrator import SilentReporter, StopTraining, TrainResult, resolve_config
from telescope_orchestrator.run.api import _Watched
from telescope_orchestrator.run.report import plain_text

COUNTDOWN = [{"name": "countdown"}]


def test_a_dict_resolves_like_the_same_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("environments: [{name: countdown}]\nnumber_of_steps: 7\n")
    from_yaml = resolve_config(path)
    from_dict = resolve_config({"environments": COUNTDOWN, "number_of_steps": 7})
    assert from_dict.config == from_yaml.config
    assert from_dict.user_keys == from_yaml.user_keys == {"environments", "number_of_steps"}
    assert resolve_config(str(path), ["--number_of_steps", "3"]).config.number_of_steps == 3


def test_a_config_object_counts_the_fields_that_differ_from_the_defaults_as_the_users():
    base = load_config(None, ["--environments", '[{"name": "countdown"}]']).config
    cfg = base.model_copy(update={"number_of_steps": 5, "group_size": 4})
    assert isinstance(cfg, TelescopeConfig)
    resolved = resolve_config(cfg, ["--group_size", "8"])
    assert resolved.config.number_of_steps == 5
    assert resolved.config.group_size == 8
    assert resolved.config.learning_rate == base.learning_rate
    assert resolved.user_keys == {"environments", "number_of_steps", "group_size"}


def test_a_resolved_config_passes_as_is_or_takes_overrides():
    resolved = load_config(None, ["--environments", '[{"name": "countdown"}]', "--number_of_steps", "4"])
    assert resolve_config(resolved) is resolved
    again = resolve_config(resolved, ["--seed", "3"])
    assert (again.config.number_of_steps, again.config.seed) == (4, 3)
    assert again.user_keys == {"environments", "number_of_steps", "seed"}


def test_a_bad_config_is_the_loaders_error():
    with pytest.raises(ConfigError, match="number_of_steps"):
        resolve_config({"environments": COUNTDOWN, "number_of_steps": -1})


class Recorder(SilentReporter):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    def step(self, metrics):
        self.steps.append(metrics["step"])


def test_each_step_reaches_the_reporter_and_on_step_until_it_asks_to_stop():
    seen: list[int] = []

    def on_step(metrics):
        seen.append(metrics["step"])
        metrics["step"] = -1  # the callback's copy: the run's metrics stay as they are
        if len(seen) == 2:
            raise StopTraining("enough")

    inner = Recorder()
    watched = _Watched(inner, on_step)
    for step in (1, 2, 3):
        watched.step({"step": step, "reward/mean": 0.5})
    assert inner.steps == [1, 2, 3]
    assert seen == [1, 2]  # asked once to stop: no more calls
    assert isinstance(watched.stop, StopTraining)
    assert watched.metrics == {"step": 3, "reward/mean": 0.5}


def test_other_errors_of_on_step_stop_the_run_as_errors():
    def broken(metrics):
        raise ValueError("bug in the callback")

    with pytest.raises(ValueError, match="bug in the callback"):
        _Watched(SilentReporter(), broken).step({"step": 1})


def test_phases_reach_the_run_through_any_reporter():
    heard: list[tuple[str, float]] = []
    watched = _Watched(SilentReporter(), None)
    watched.on_phase = lambda text, at, seconds: heard.append((text, seconds))
    with watched.phase("model"):
        pass
    with pytest.raises(RuntimeError), watched.phase("Ray"):
        raise RuntimeError("failed phase")
    assert [text for text, _ in heard] == ["model", "Ray"]
    assert all(seconds >= 0 for _, seconds in heard)


def test_plain_text_drops_the_console_markup_only():
    text = "[yellow]trainer 0 died[/yellow] during [bold]step 3[/bold]: list[int] stays"
    assert plain_text(text) == "trainer 0 died during step 3: list[int] stays"


def test_a_result_says_where_and_how_far():
    result = TrainResult(run_dir=__import__("pathlib").Path("/r"), last_step=2, stopped_early=True)
    assert (result.last_step, result.metrics, result.stopped_early) == (2, {}, True)
