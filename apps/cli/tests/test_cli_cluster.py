"""``ray.init`` options from the config: the ray_* fields that shape the workers' environment."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from telescope_cli._cluster import ray_init_options


def _cfg(**kw):
    base = dict(
        ray_runtime_env=None, ray_propagate_active_venv=True, ray_pin_py_executable=True,
        ray_namespace="telescope", ray_log_to_driver=True, debug=False,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_defaults_pin_the_interpreter_pass_the_run_env_and_keep_worker_logs_off_the_console():
    environ = {"VIRTUAL_ENV": "/v", "UV_PROJECT_ENVIRONMENT": "/u", "OTHER": "x"}
    opts = ray_init_options(_cfg(), {"TELESCOPE_RUN_DIR": "/r"}, environ=environ)
    assert opts["runtime_env"] == {
        "env_vars": {"TELESCOPE_RUN_DIR": "/r", "VIRTUAL_ENV": "/v", "UV_PROJECT_ENVIRONMENT": "/u"},
        "py_executable": sys.executable,
    }
    assert opts["log_to_driver"] is False  # ray_log_to_driver is honoured only with debug
    assert opts["namespace"] == "telescope"


def test_each_field_switches_its_part():
    opts = ray_init_options(
        _cfg(ray_propagate_active_venv=False, ray_pin_py_executable=False, debug=True),
        {},
        environ={"VIRTUAL_ENV": "/v"},
    )
    assert opts["runtime_env"] == {"env_vars": {}}
    assert opts["log_to_driver"] is True
    quiet = ray_init_options(_cfg(debug=True, ray_log_to_driver=False), {}, environ={})
    assert quiet["log_to_driver"] is False


def test_the_users_runtime_env_wins():
    user = {"env_vars": {"TELESCOPE_RUN_DIR": "/mine", "X": "1"}, "py_executable": "/opt/py", "pip": ["a"]}
    opts = ray_init_options(_cfg(ray_runtime_env=user), {"TELESCOPE_RUN_DIR": "/r"}, environ={})
    assert opts["runtime_env"] == {
        "env_vars": {"TELESCOPE_RUN_DIR": "/mine", "X": "1"},
        "py_executable": "/opt/py",
        "pip": ["a"],
    }
    assert user["env_vars"] == {"TELESCOPE_RUN_DIR": "/mine", "X": "1"}  # not modified


def test_cpu_trainer_ranks_split_the_nodes_cores_evenly():
    from telescope_cli._actors import trainer_cpu_threads

    assert trainer_cpu_threads(2, 1) == 2  # the quickstart: one rank takes both cores
    assert trainer_cpu_threads(2, 2) == 1
    assert trainer_cpu_threads(16, 3) == 5  # rounded down, so the ranks never oversubscribe
    assert trainer_cpu_threads(2, 3) == 1  # at least one thread
    assert trainer_cpu_threads(4, 0) == 4  # no count: the rank is alone
