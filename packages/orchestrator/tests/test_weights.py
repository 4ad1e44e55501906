"""The one publish path (``run.weights.WeightUpdates``) and where metrics lines go
(``record.lines.MetricsLines``), with a fake engine, sender and W&B run."""

from __future__ import annotations

import json

import pytest

from telescope_orchestrator.record.lines import MetricsLines
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.run.weights import WeightUpdates, weight_groups

SERVERS = ["http://s0", "http://s1", "http://s2"]


class Engine:
    def __init__(self) -> None:
        self.updates: list[tuple[int, list[str] | None]] = []

    def weights_updated(self, version: int, servers: list[str] | None = None) -> None:
        self.updates.append((version, servers))


async def test_a_publish_tells_the_engine_which_servers_hold_the_new_version():
    sent: list[tuple[int, str]] = []

    async def send(step: int, group: str) -> tuple[dict[str, float], list[str]]:
        sent.append((step, group))
        return {"bytes": 8.0}, ["http://s0"]  # s1 is down: the supervisor left it out

    engine = Engine()
    groups = weight_groups(SERVERS, has_evals=True, eval_num_servers=1)
    weights = WeightUpdates(groups, engine, send)  # type: ignore[arg-type]
    assert weights.servers == SERVERS
    assert await weights.publish(3, "training_only") == {"bytes": 8.0}
    assert sent == [(3, "training_only")]
    assert engine.updates == [(3, ["http://s0"])]
    weights.resumed(7)
    assert engine.updates[-1] == (7, None)  # every server


async def test_a_group_the_run_does_not_have_is_refused_before_anything_is_sent():
    async def send(step: int, group: str) -> tuple[dict[str, float], list[str]]:
        raise AssertionError("sent")

    weights = WeightUpdates({"full": SERVERS}, Engine(), send)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no weight-sync group 'training_only': the run has \['full'\]"):
        await weights.publish(1, "training_only")
    with pytest.raises(ValueError, match="no 'full' group"):
        WeightUpdates({"training_only": SERVERS}, Engine(), send)  # type: ignore[arg-type]


class Wandb:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        self.logged.append((step, data))


def test_a_late_line_goes_to_the_latest_wandb_step_and_to_its_own_step_in_the_file(tmp_path):
    run = RunDir(tmp_path / "run")
    wandb = Wandb()
    lines = MetricsLines(run, wandb, start_step=2)
    lines.write({"step": 3, "loss": 1.5}, step=3)
    lines.write({"eval/x": 0.5}, step=2, file_only={"step": 2, "time": 9.0})  # an eval of step 2, late
    assert wandb.logged == [(3, {"loss": 1.5}), (3, {"eval/x": 0.5})]
    assert [json.loads(x) for x in run.metrics_file.read_text().splitlines()] == [
        {"step": 3, "loss": 1.5},
        {"step": 2, "time": 9.0, "eval/x": 0.5},
    ]
    MetricsLines(run).write({"step": 4}, step=4)  # no W&B: the file only
    assert json.loads(run.metrics_file.read_text().splitlines()[-1]) == {"step": 4}
