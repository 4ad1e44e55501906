"""The shared-storage check of a joined cluster (``cluster.storage``): what a node's probe writes and
sees, and the message naming the first node that does not share a directory with the driver."""

from __future__ import annotations

from pathlib import Path

from telescope_orchestrator.cluster.storage import MARKERS, NodeReport, _probe, storage_problem

TOKEN = "driver-abc"


def _driver_marker(d: Path) -> None:
    (d / MARKERS).mkdir(parents=True, exist_ok=True)
    (d / MARKERS / TOKEN).write_text("driver")


def test_a_node_that_shares_both_directories_passes(tmp_path):
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    for d in (run, ckpt):
        _driver_marker(d)
    report = _probe([str(run), str(ckpt)], TOKEN, "node-1", "10.0.0.2")  # what the pinned task does
    assert report.seen == {str(run): True, str(ckpt): True}
    assert (run / MARKERS / f"node-1.{TOKEN}").read_text() == "node-1"
    assert storage_problem([run, ckpt], TOKEN, [report]) is None


def test_a_node_without_the_shared_mount_is_named_with_the_directory_and_the_fix(tmp_path):
    run = tmp_path / "run"
    _driver_marker(run)
    # the node wrote into a folder of its own disk: it saw no driver marker, the driver sees nothing
    lost = NodeReport("f" * 40, "10.0.0.3", {str(run): False})
    problem = storage_problem([run], TOKEN, [lost])
    assert problem is not None
    assert problem.startswith(
        f"Ray node ffffffffffff (10.0.0.3) does not see the driver's files in it: {run}."
    )
    assert "Mount one shared filesystem at that path on every node" in problem
    assert "--run-dir and --checkpoint_dir" in problem


def test_a_node_whose_marker_the_driver_does_not_see_is_named(tmp_path):
    run = tmp_path / "run"
    _driver_marker(run)
    # it claims to see the driver's marker (a stale copy, say), but its own never arrived
    problem = storage_problem([run], TOKEN, [NodeReport("n2", "10.0.0.4", {str(run): True})])
    assert problem is not None
    assert "writes into a folder of that name the driver does not see" in problem


def test_a_node_that_cannot_write_is_named_with_its_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    report = _probe([str(blocked)], TOKEN, "n3", "10.0.0.5")
    assert isinstance(report.seen[str(blocked)], str)
    problem = storage_problem([blocked], TOKEN, [report])
    assert problem is not None
    assert (
        "cannot write into it (NotADirectoryError" in problem
        or "cannot write into it (FileExistsError" in problem
    )
