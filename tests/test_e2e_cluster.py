"""`telescope train` on a Ray cluster it did not start, as a user who outgrew one machine runs it.

The cluster is this test's own (``ray.cluster_utils.Cluster``): a head node and a worker node of one
CPU each on this host, so a vLLM server (one CPU) and a trainer rank (one CPU) can never share a
node. Before and after each run the cluster's state is read from a separate driver: its nodes, its
free CPUs, its live actors and placement groups. A run must leave it as it found it: every node
alive, every CPU free, no actor or placement group of the run left, the cluster still up.

- ``ray_address: auto`` finds the cluster (``RAY_ADDRESS``); the run spans both nodes (the server
  and the trainer rank on different nodes, placement strategies SPREAD and STRICT_SPREAD), weights
  travel over the node address (loopback off), and the sampler agrees with the trainer
  (``kl_divergence_inference`` < 1e-3); the setup record names each process's Ray node and ``infra``
  has every node's system and processes;
- a Ctrl-C while the run starts stops it;
- a run whose trainer bundle no node can hold fails with the free resources of each node;
- ``ray_address: auto`` with no cluster running (a PID namespace of its own, where no Ray is
  visible) starts a local Ray, and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from e2e_support import (
    SCALE_DOWN,
    Finished,
    base_args,
    interrupt,
    reap,
    run_env,
    start,
    stuck_report,
    train,
    wait_for,
    wait_gone,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.xdist_group("ray_cluster")]

ENV = '[{"name": "e2e_envs:DigitsEnv"}]'
STATE = """
import json, sys
import ray
from ray._private import state
from ray.util import placement_group_table
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
alive = [a for a in state.actors().values() if a["State"] != "DEAD"]
print(json.dumps({
    "nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
    "cpus": ray.cluster_resources().get("CPU"),
    "free_cpus": ray.available_resources().get("CPU"),
    "actors": sorted(a["ActorClassName"] for a in alive),
    "groups": sum(g["state"] != "REMOVED" for g in placement_group_table().values()),
    "placed": {a["ActorClassName"]: a["Address"]["NodeID"] for a in state.actors().values()},
}))
"""


def cluster_state(address: str) -> dict[str, Any]:
    """The cluster as a separate driver sees it (this process never joins it)."""
    out = subprocess.run(
        [sys.executable, "-c", STATE, address], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_left_as_found(address: str, before: dict[str, Any]) -> dict[str, Any]:
    after = cluster_state(address)
    assert after["nodes"] == before["nodes"], "a node of the cluster is gone"
    assert after["free_cpus"] == after["cpus"] == before["cpus"], after
    assert after["actors"] == [], after["actors"]
    assert after["groups"] == 0, "a placement group of the run is left"
    return after


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """A head and a worker node of one CPU each. No address file is written (``ray start`` and
    this helper write /tmp/ray/ray_current_cluster): other tests' runs never see this cluster."""
    import importlib

    from ray.cluster_utils import Cluster

    utils = importlib.import_module("ray._private.utils")
    with mock.patch.object(utils, "write_ray_address", return_value=None):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def _args(tiny_model_dir: Path, *extra: str) -> list[str]:
    scaled = list(SCALE_DOWN)
    i = scaled.index("--ray_address")
    del scaled[i : i + 2]  # each test names its own
    return [*base_args(tiny_model_dir), *scaled, "--environments", ENV, *extra]


def test_a_run_joins_a_cluster_spans_its_nodes_and_leaves_it_as_found(ray_cluster, tiny_model_dir, tmp_path):
    address = ray_cluster.address
    before = cluster_state(address)
    assert len(before["nodes"]) == 2
    with mock.patch.dict(os.environ, {"RAY_ADDRESS": address}):  # train() passes the environment on
        run = train(
            tmp_path / "run", *_args(tiny_model_dir), "--ray_address", "auto", "--number_of_steps", "3",
            "--ray_inference_placement_strategy", "SPREAD",
            "--ray_trainer_placement_strategy", "STRICT_SPREAD",
            "--ray_broadcast_prefer_loopback_if_single_node", "false",
        )  # fmt: skip
    assert run.returncode == 0, run.output[-4000:]
    assert "Traceback" not in run.output
    assert f"joined the Ray cluster at {address}: 2 node(s), 2 CPUs" in run.output, run.output[-3000:]
    lines = run.step_metrics()
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:  # the servers hold the trainer's weights, sent over the node address
        assert m["kl_divergence_inference"] < 1e-3, m
    after = assert_left_as_found(address, before)
    placed = after["placed"]  # dead actors keep their node in the cluster's table
    assert placed["InferenceServerActor"] != placed["TrainerActor"], placed
    assert wait_gone(run.run_dir, timeout_s=30) == []
    _check_every_node_observed(
        run.run_dir, server=placed["InferenceServerActor"], trainer=placed["TrainerActor"]
    )


def _check_every_node_observed(run_dir: Path, *, server: str, trainer: str) -> None:
    """The setup record names each process's Ray node; infra has both nodes' system rows and each
    process's rows from the node it ran on (the driver samples its own node, an observer the other)."""
    import telescope_records as tr

    db = tr.connect(run_dir)
    nodes = dict(db.execute("select role, node_id from setup").fetchall())
    assert nodes["trainer:0"] == trainer, nodes
    assert [n for r, n in nodes.items() if r.startswith("vllm:")] == [server], nodes
    assert nodes["driver"] in (server, trainer)
    system = {
        n for (n,) in db.execute("select distinct node_id from infra where source = 'system'").fetchall()
    }
    assert system == {server, trainer}, system
    processes = dict(
        db.execute("select distinct target, node_id from infra where source = 'process'").fetchall()
    )
    assert processes["trainer:0"] == trainer, processes
    assert [n for r, n in processes.items() if r.startswith("vllm:")] == [server], processes


def test_ctrl_c_while_the_run_starts_leaves_the_cluster_as_found(ray_cluster, tiny_model_dir, tmp_path):
    """Ctrl-C once the run holds its placement groups and its server is starting (its log exists),
    before any step: the harder moment, and the quicker one to test."""
    address = ray_cluster.address
    before = cluster_state(address)
    run_dir = tmp_path / "run"
    proc = start(run_dir, *_args(tiny_model_dir), "--ray_address", address, "--number_of_steps", "1000")
    try:
        wait_for(run_dir / "logs" / "inference" / "server_0.log", proc, timeout_s=300)
        assert interrupt(run_dir, proc) == 130, stuck_report(run_dir, proc)
    finally:
        reap(proc)
    output = (tmp_path / "run.console").read_text(errors="replace")
    assert "Traceback" not in output
    assert f"joined the Ray cluster at {address}" in output, output[-3000:]
    assert wait_gone(run_dir, timeout_s=60) == []
    assert_left_as_found(address, before)


def test_a_run_no_node_can_hold_fails_and_leaves_the_cluster_as_found(ray_cluster, tiny_model_dir, tmp_path):
    address = ray_cluster.address
    before = cluster_state(address)
    run = train(
        tmp_path / "run", *_args(tiny_model_dir), "--ray_address", address,
        "--ray_trainer_cpus_per_worker", "2", "--ray_placement_timeout_s", "15", timeout_s=300,
    )  # fmt: skip
    assert run.returncode == 1, run.output[-3000:]
    assert "Traceback" not in run.output
    assert "Ray could not reserve 1 trainer bundle(s) of {'CPU': 2.0}" in run.output, run.output[-3000:]
    assert "(0 such bundles)" in run.output  # every node listed with what it has free
    assert "ray_trainer_cpus_per_worker" in run.output
    assert wait_gone(run.run_dir, timeout_s=60) == []
    assert_left_as_found(address, before)


def test_auto_without_a_cluster_starts_a_local_ray(tiny_model_dir, tmp_path):
    """In a PID namespace of its own (no other Ray's processes visible) and a temp dir of its own (no
    address file), ``auto`` finds no cluster and starts one for the run. (Every other e2e run trains
    on a local Ray; this one stops at its placement, which one node cannot hold: two trainer ranks on
    distinct nodes, so it starts no server.)"""
    run_dir = tmp_path / "run"
    own_tmp = tempfile.mkdtemp(prefix="tr-", dir="/tmp")  # Ray's socket paths must stay short
    env = {**run_env(), "TMPDIR": own_tmp, "RAY_ADDRESS": ""}
    cmd = [
        "unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "telescope_cli", "train",
        "--run-dir", str(run_dir), *_args(tiny_model_dir), "--ray_address", "auto",
        "--trainer_num_workers", "2", "--ray_trainer_placement_strategy", "STRICT_SPREAD",
        "--ray_placement_timeout_s", "5",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        shutil.rmtree(own_tmp, ignore_errors=True)
    run = Finished(done.returncode, done.stdout + done.stderr, 0.0, run_dir)
    assert run.returncode == 1, run.output[-4000:]
    assert "Traceback" not in run.output
    assert "started a local Ray of" in run.output, run.output[-4000:]
    assert "(no cluster answered ray_address: auto)" in run.output
    assert "Ray could not reserve 2 trainer bundle(s)" in run.output, run.output[-4000:]
