"""Checkpoint bookkeeping without a model: which step dirs count, retention, when to save."""

import pytest

from telescope_trainer_fsdp import (
    checkpoint_due,
    checkpoints_to_delete,
    list_checkpoints,
    prune_checkpoints,
    resolve_checkpoint,
)


def _fake(root, step, complete=True, suffix=""):
    d = root / f"step_{step}{suffix}"
    d.mkdir(parents=True)
    if complete:
        (d / "meta.json").write_text("{}")
    return d


def test_only_complete_step_dirs_are_listed(tmp_path):
    _fake(tmp_path, 2)
    _fake(tmp_path, 10)
    _fake(tmp_path, 4, complete=False)  # died before meta.json
    _fake(tmp_path, 12, suffix=".tmp")  # interrupted write
    _fake(tmp_path, 6, suffix=".old")
    (tmp_path / "notes.txt").write_text("x")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 10]
    assert list_checkpoints(tmp_path / "missing") == []
    assert resolve_checkpoint(tmp_path) == tmp_path / "step_10"
    assert resolve_checkpoint(tmp_path, 2) == tmp_path / "step_2"
    assert resolve_checkpoint(tmp_path / "step_2") == tmp_path / "step_2"
    with pytest.raises(FileNotFoundError, match=r"no checkpoint step_4 .* found steps \[2, 10\]"):
        resolve_checkpoint(tmp_path, 4)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "step_4")


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


def test_prune_deletes_the_directories(tmp_path):
    for s in (1, 2, 3):
        _fake(tmp_path, s)
    _fake(tmp_path, 4, suffix=".tmp")
    gone = prune_checkpoints(tmp_path, current=3, keep_last=1, keep_every=None)
    assert sorted(p.name for p in gone) == ["step_1", "step_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3", "step_4.tmp"]


@pytest.mark.parametrize(
    ("every", "steps"),
    [(False, []), (0, []), (None, []), (1, [0, 1, 2, 3, 4, 5, 6]), (3, [2, 5, 6])],  # 0-based; last is 6
)
def test_checkpoint_due_every_n_and_at_the_last_step(every, steps):
    assert [s for s in range(7) if checkpoint_due(s, every=every, total_steps=7)] == steps


def test_checkpoint_due_rejects_true():
    with pytest.raises(ValueError, match="ambiguous"):
        checkpoint_due(0, every=True, total_steps=3)
