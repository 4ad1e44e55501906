"""Checkpoint layout, atomic writes, retention and the choice of which checkpoint to resume (spec §7).

Layout under the checkpoint root::

    step_<N>/
      meta.json                backend, base model, step, time, config hash, world size, training_state,
                               extra_state (the caller's JSON state: sampler, engine counters, ...)
      hf_meta/                 Hugging Face config, generation config and tokenizer files
      .metadata, *.distcp      PyTorch DCP: {"model": ..., "optimizer": ...} (optimizer: training state only)
      trainer_state.pt         LR scheduler and trainer counters (training state only)
      rng_state_rank_<r>.pt    Python, NumPy, torch (and CUDA) RNG of rank r (training state only)

A checkpoint is written into ``step_<N>.tmp`` and renamed to ``step_<N>`` only once every rank has
finished and ``meta.json`` is written; an interrupted write leaves a ``.tmp`` directory that
:func:`list_checkpoints` ignores and the next save of that step clears. An existing ``step_<N>`` is
replaced only after the new one is complete.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

__all__ = [
    "CHECKPOINT_PREFIX",
    "checkpoint_due",
    "checkpoints_to_delete",
    "list_checkpoints",
    "prune_checkpoints",
    "read_meta",
    "resolve_checkpoint",
]

CHECKPOINT_PREFIX = "step_"
META_FILE = "meta.json"
HF_META_DIR = "hf_meta"
TRAINER_STATE_FILE = "trainer_state.pt"
_NAME = re.compile(r"^step_(\d+)$")


def rng_file(rank: int) -> str:
    return f"rng_state_rank_{rank}.pt"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first; temp dirs are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / META_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def read_meta(checkpoint: str | Path) -> dict:
    """The ``meta.json`` of one checkpoint directory."""
    path = Path(checkpoint) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{checkpoint} is not a complete checkpoint (no {META_FILE}); pass a step_<N> directory "
            "written by save_checkpoint, or the checkpoint root to take the latest"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def resolve_checkpoint(path: str | Path, step: int | None = None) -> Path:
    """A checkpoint directory from either itself or its root (then ``step``, default the latest)."""
    path = Path(path)
    if (path / META_FILE).is_file() and step is None:
        return path
    found = dict(list_checkpoints(path))
    if not found:
        raise FileNotFoundError(f"no complete checkpoint (step_<N>/{META_FILE}) under {path}")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise FileNotFoundError(f"no checkpoint step_{step} under {path}; found steps {sorted(found)}")
    return found[step]


def checkpoint_due(step: int, *, every: int | bool | None, total_steps: int) -> bool:
    """Whether to save after train step ``step`` (0-based): every ``every`` steps and at the last step.

    The directory of that checkpoint is ``step_<step + 1>`` (the number of steps done).
    """
    if not every:
        return False
    if every is True:
        raise ValueError("checkpoint_every: true is ambiguous; give an integer number of steps")
    done = step + 1
    return done % int(every) == 0 or done == total_steps


def checkpoints_to_delete(
    steps: list[int], *, current: int, keep_last: int | None, keep_every: int | None
) -> list[int]:
    """Steps to delete: all but the current, the ``keep_last`` newest and the multiples of ``keep_every``.

    With both rules off (None) nothing is deleted.
    """
    if keep_last is None and keep_every is None:
        return []
    ordered = sorted(steps)
    keep = {current}
    if keep_last is not None:
        if keep_last < 1:
            raise ValueError(f"checkpoint_keep_last must be >= 1 or null, got {keep_last}")
        keep.update(ordered[-keep_last:])
    if keep_every is not None:
        if keep_every < 1:
            raise ValueError(f"checkpoint_keep_every must be >= 1 or null, got {keep_every}")
        keep.update(s for s in ordered if s % keep_every == 0)
    return [s for s in ordered if s not in keep]


def prune_checkpoints(
    root: str | Path, *, current: int, keep_last: int | None, keep_every: int | None
) -> list[Path]:
    """Delete the checkpoints :func:`checkpoints_to_delete` names; return the deleted paths."""
    found = dict(list_checkpoints(root))
    doomed = checkpoints_to_delete(list(found), current=current, keep_last=keep_last, keep_every=keep_every)
    for s in doomed:
        shutil.rmtree(found[s])
    return [found[s] for s in doomed]


def commit(tmp: Path, final: Path) -> None:
    """Move a finished ``tmp`` checkpoint to ``final``, replacing an older one only at the last moment."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)
