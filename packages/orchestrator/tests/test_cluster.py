"""``ray.init`` options from the config: the ray_* fields that shape the workers' environment."""

from __future__ import annotations

import sys

from telescope_config.testing import make_config
from telescope_orchestrator.cluster.ray_cluster import ray_init_options


def _cfg(**kw):
    base = dict(
        ray_runtime_env=None, ray_propagate_active_venv=True, ray_pin_py_executable=True,
        ray_namespace="telescope", ray_log_to_driver=True, debug=False,
    )  # fmt: skip
    return make_config(**{**base, **kw})


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


def test_a_cpu_node_is_split_between_servers_and_trainer_ranks_without_oversubscribing():
    from telescope_orchestrator.cluster.actors import CpuPlan, cpu_plan

    # the quickstart on 2 cores: the server computes on core 0, the trainer on core 1 (both while
    # the server is idle)
    assert cpu_plan([0, 1], 1, 1, 1) == CpuPlan(["0"], 1, 2)
    assert cpu_plan([0, 1, 2, 3], 1, 1, 1) == CpuPlan(["0,1"], 2, 4)  # half each
    assert cpu_plan([0, 1, 2, 3, 4, 5, 6, 7], 2, 1, 2) == CpuPlan(["0,1", "2,3"], 2, 4)
    assert cpu_plan([0, 1, 2, 3, 4, 5, 6, 7], 1, 2, 1) == CpuPlan(["0,1|2,3"], 4, 8)  # a run per TP rank
    assert cpu_plan([0, 1], 2, 1, 1) == CpuPlan(["0", "0"], 1, 2)  # too few cores: servers share core 0
    assert cpu_plan([0, 1], 1, 1, 2) == CpuPlan(["0"], 1, 1)  # at least one thread per rank
    assert cpu_plan([4, 5, 6], 1, 1, 1) == CpuPlan(["4"], 2, 3)  # the affinity's own core ids
    assert cpu_plan([0, 1], 0, 1, 2) == CpuPlan([], 1, 1)  # no server: the ranks share every core
    assert cpu_plan([0, 1, 2, 3], 2, 1, 0).server_binds == ["0,1", "2,3"]  # no trainer: servers take all


def test_the_run_and_checkpoint_folders_stay_out_of_a_working_dir_upload(tmp_path):
    work = tmp_path / "project"
    (work / "runs" / "r1").mkdir(parents=True)
    cfg = make_config(ray_runtime_env={"working_dir": str(work), "excludes": ["*.bin"]})
    outside = tmp_path / "elsewhere" / "ckpt"
    opts = ray_init_options(cfg, {}, environ={}, keep_out=[work / "runs" / "r1", outside])
    assert opts["runtime_env"]["excludes"] == ["*.bin", "/runs/r1/"]  # the user's first; outside: nothing
    remote = make_config(ray_runtime_env={"working_dir": "s3://bucket/project.zip"})
    assert "excludes" not in ray_init_options(remote, {}, environ={}, keep_out=[work])["runtime_env"]
    plain = ray_init_options(make_config(), {}, environ={}, keep_out=[work])
    assert "excludes" not in plain["runtime_env"]
