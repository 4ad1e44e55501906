import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from telescope_rollout import UnknownEnvironmentError, build_environments, get_environment, list_environments
from telescope_rollout.envs.boxed_math import HendrycksMathEnv
from telescope_rollout.envs.countdown import CountdownEnv
from telescope_rollout.envs.i3_code import I3CodeEnv
from telescope_rollout.envs.wordle import WordleEnv

INTELLECT3_BLOCK = [
    {"name": "countdown", "weight": 1.0, "kwargs": {}, "reward_min": 0.0, "reward_max": 2.0},
    {"name": "hendrycks_math", "weight": 2.0, "kwargs": {"system_prompt": "Be careful."}},
    {"name": "wordle", "weight": 0.5, "kwargs": {"max_turns": 4, "num_samples": 10}},
    {"name": "i3_code", "kwargs": {"provider": "prime", "pool_size": 4, "timeout_per_test": 5}},
    {"name": "dapo_math"},
    {"name": "deepscaler", "reward_max": 1.0},
]


@dataclass
class Entry:
    name: str
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)
    reward_min: float | None = None
    reward_max: float | None = None


def test_an_intellect3_style_environments_block_builds():
    built = build_environments(INTELLECT3_BLOCK)
    assert [b.name for b in built] == [e["name"] for e in INTELLECT3_BLOCK]
    assert [b.env.name for b in built] == [e["name"] for e in INTELLECT3_BLOCK]
    assert isinstance(built[0].env, CountdownEnv)
    assert built[0].env.reward_max == 2.0
    assert built[1].weight == 2.0
    assert isinstance(built[1].env, HendrycksMathEnv)
    assert built[1].env.system_prompt == "Be careful."
    assert isinstance(built[2].env, WordleEnv)
    assert built[2].env.max_turns == 4
    assert built[2].env.is_multi_turn
    assert isinstance(built[3].env, I3CodeEnv)
    assert vars(built[3].env)["provider"] == "prime"  # an undeclared kwarg: set as an attribute
    assert built[3].env.timeout_per_test == 5
    assert built[3].weight == 1.0
    objs = build_environments([Entry("countdown", 0.3, reward_min=-1.0)])
    assert objs[0].weight == 0.3
    assert objs[0].env.reward_min == -1.0


def test_errors_name_the_fix():
    with pytest.raises(
        UnknownEnvironmentError, match=r"known: aime_2024, .*countdown, dapo_math.*my_pkg.my_module:MyEnv"
    ):
        get_environment("countdwn")
    with pytest.raises(ValueError, match="twice"):
        build_environments([{"name": "countdown"}, {"name": "countdown"}])
    with pytest.raises(ValueError, match="empty"):
        build_environments([])
    with pytest.raises(ValueError, match="weight"):
        build_environments([{"name": "countdown", "weight": 0}])


def test_module_path_environment(tmp_path, monkeypatch):
    (tmp_path / "my_envs_pkg").mkdir()
    (tmp_path / "my_envs_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_envs_pkg" / "echo.py").write_text(
        textwrap.dedent(
            """
            from telescope_rollout import Sample, SingleTurnEnvironment

            class EchoEnv(SingleTurnEnvironment):
                def load_dataset(self, num_samples=-1, **kw):
                    return self._set_samples([Sample("say hi", "hi")], num_samples)

                def compute_reward(self, completion, sample, eos_token=""):
                    return float(completion.strip() == sample.answer)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = get_environment("my_envs_pkg.echo:EchoEnv", greeting="x")
        assert vars(env)["greeting"] == "x"
        assert env.name == "my_envs_pkg.echo:EchoEnv"
        assert type(get_environment("my_envs_pkg.echo")).__name__ == "EchoEnv"  # first concrete class
        built = build_environments([{"name": "my_envs_pkg.echo:EchoEnv", "weight": 2}])
        assert built[0].weight == 2.0
    finally:
        for mod in [m for m in sys.modules if m.startswith("my_envs_pkg")]:
            del sys.modules[mod]


def test_list_environments_rows():
    rows = {r["name"]: r for r in list_environments()}
    assert {
        "countdown",
        "hendrycks_math",
        "dapo_math",
        "deepscaler",
        "wordle",
        "i3_code",
        "quickstart_add",
        "quickstart_agent",
    } <= set(rows)
    assert rows["wordle"]["kind"] == "multi"
    assert rows["quickstart_agent"]["kind"] == "agent"
    assert "openai" in rows["quickstart_agent"]["requirements"]
    assert rows["countdown"]["kind"] == "single"
    assert "sandbox" in rows["i3_code"]["requirements"]
    assert rows["hendrycks_math"]["installed"] is True
    assert all(set(r) >= {"name", "kind", "requirements", "installed"} for r in rows.values())
