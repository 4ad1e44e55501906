"""The CLI's checkpoint layout without a model: which step folders count, atomic commit, retention,
which to resume, when to save."""

import json

import pytest

from telescope_config.testing import make_config
from telescope_orchestrator.run.checkpoints import (
    CheckpointError,
    begin,
    checkpoints_to_delete,
    commit,
    find_checkpoint,
    list_checkpoints,
    prune,
    read_meta,
)
from telescope_orchestrator.run.loop import _should_checkpoint


def _fake(root, step, complete=True, suffix=""):
    d = root / f"step_{step}{suffix}"
    d.mkdir(parents=True)
    if complete:
        (d / "meta.json").write_text("{}")
    return d


def test_only_complete_step_folders_are_listed(tmp_path):
    _fake(tmp_path, 2)
    _fake(tmp_path, 10)
    _fake(tmp_path, 4, complete=False)  # died before meta.json
    _fake(tmp_path, 12, suffix=".tmp")  # interrupted write
    _fake(tmp_path, 6, suffix=".old")
    (tmp_path / "notes.txt").write_text("x")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 10]
    assert list_checkpoints(tmp_path / "missing") == []
    assert find_checkpoint(tmp_path) == tmp_path / "step_10"
    assert find_checkpoint(tmp_path, 2) == tmp_path / "step_2"
    with pytest.raises(CheckpointError, match=r"no checkpoint step_4 in .*; found: step_2, step_10"):
        find_checkpoint(tmp_path, 4)
    with pytest.raises(CheckpointError, match="holds no step_N checkpoint"):
        find_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        read_meta(tmp_path / "step_4")


def test_commit_renames_a_complete_folder_and_replaces_an_old_one_last(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    (root / "other_data.txt").write_text("keep me")  # a checkpoint_dir shared with other data
    old = _fake(root, 3)
    (old / "weights").write_text("old")
    tmp = begin(root, 3)
    assert tmp.name == "step_3.tmp"
    assert list(tmp.iterdir()) == []
    (tmp / "weights").write_text("new")
    assert [s for s, _ in list_checkpoints(root)] == [3]  # the old one still counts while writing
    final = commit(tmp, 3, {"backend": "fake", "extra_state": {"engine": {"step": 3}}})
    assert final == root / "step_3"
    assert (final / "weights").read_text() == "new"
    meta = json.loads((final / "meta.json").read_text())
    assert meta["backend"] == "fake"
    assert meta["step"] == 3
    assert meta["extra_state"] == {"engine": {"step": 3}}
    assert sorted(p.name for p in root.iterdir()) == ["other_data.txt", "step_3"]


def test_begin_clears_what_an_interrupted_save_left(tmp_path):
    stale = _fake(tmp_path, 5, complete=False, suffix=".tmp")
    (stale / "half_written").write_text("x")
    tmp = begin(tmp_path, 5)
    assert tmp == stale
    assert list(tmp.iterdir()) == []


def test_commit_refuses_meta_that_is_not_json_and_moves_nothing(tmp_path):
    tmp = begin(tmp_path, 1)
    with pytest.raises(TypeError):
        commit(tmp, 1, {"extra_state": object()})
    assert tmp.is_dir()
    assert list_checkpoints(tmp_path) == []


@pytest.mark.parametrize(
    ("keep_last", "keep_every", "deleted"),
    [
        (None, None, []),  # no retention at all
        (2, None, [1, 2, 3, 4]),  # 5 and 6 newest; current 6
        (1, None, [1, 2, 3, 4]),  # newest 6, plus the current (5) even though not newest
        (None, 2, [1, 3]),  # multiples of 2 and the current 5
        (1, 3, [1, 2, 4]),  # newest 6, multiples 3 and 6, current 5
    ],
)
def test_retention_keeps_current_newest_and_multiples(keep_last, keep_every, deleted):
    current = 5 if keep_last != 2 else 6
    assert (
        checkpoints_to_delete([6, 1, 2, 3, 4, 5], current=current, keep_last=keep_last, keep_every=keep_every)
        == deleted
    )


def test_prune_deletes_only_step_folders(tmp_path):
    for s in (1, 2, 3):
        _fake(tmp_path, s)
    _fake(tmp_path, 4, suffix=".tmp")
    (tmp_path / "step_x").mkdir()
    gone = prune(tmp_path, current=3, keep_last=1, keep_every=None)
    assert sorted(p.name for p in gone) == ["step_1", "step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_4.tmp", "step_x"]


@pytest.mark.parametrize(
    ("every", "steps"),
    [(False, []), (0, []), (None, []), (1, [1, 2, 3, 4, 5, 6, 7]), (3, [3, 6, 7])],  # steps 1..7
)
def test_checkpoint_due_every_n_and_at_the_last_step(every, steps):
    # model_copy, unvalidated: None is no config value, yet _should_checkpoint treats it as off
    cfg = make_config(number_of_steps=7).model_copy(update={"checkpoint_every": every})
    assert [s for s in range(1, 8) if _should_checkpoint(cfg, s)] == steps


def test_a_resumed_engine_counts_from_the_checkpoints_step():
    from telescope_orchestrator.run.startup import resumed_engine_state

    # saved at step 2 while batches 3 and 4 were already queued (max_async_rollout 2)
    saved = {"sampler": {"draws": 17}, "step": 4, "version": 2, "next_group_id": 9, "next_sample_id": 72}
    state = resumed_engine_state(saved, 2)
    assert state == {**saved, "step": 2, "version": 2}  # the sampler goes on: no prompt drawn twice
    assert saved["step"] == 4  # the checkpoint's copy is left alone


def test_resuming_from_an_earlier_step_sets_the_later_checkpoints_aside(tmp_path):
    from telescope_orchestrator.run.checkpoints import set_aside_later

    for s in (2, 4, 6):
        _fake(tmp_path, s)
    (tmp_path / "step_6.abandoned").mkdir()  # set aside by an earlier resume
    moved = set_aside_later(tmp_path, 2)
    assert sorted(p.name for p in moved) == ["step_4.abandoned", "step_6.abandoned2"]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert find_checkpoint(tmp_path) == tmp_path / "step_2"


def test_convert_says_what_is_wrong_with_a_folder_it_cannot_convert(tmp_path):
    from telescope_orchestrator import CheckpointError, convert_checkpoint

    with pytest.raises(CheckpointError, match=r"is not a checkpoint \(no meta\.json\)"):
        convert_checkpoint(tmp_path, tmp_path / "out")
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"meta\.json is not JSON .*: the checkpoint is damaged"):
        convert_checkpoint(tmp_path, tmp_path / "out")
    (tmp_path / "meta.json").write_text(json.dumps({"step": 1, "backend": "jax"}))
    with pytest.raises(CheckpointError, match="the 'jax' backend, which is not installed; installed: fsdp"):
        convert_checkpoint(tmp_path, tmp_path / "out")
    (tmp_path / "meta.json").write_text(json.dumps({"step": 1, "backend": "fsdp"}))
    with pytest.raises(CheckpointError, match="could not be converted"):  # no weights in it
        convert_checkpoint(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
