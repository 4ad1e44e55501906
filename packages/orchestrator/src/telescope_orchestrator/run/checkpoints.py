"""The checkpoints of a run: layout, atomic commit, ``meta.json``, retention and which to resume.

The orchestrator owns all of it; a trainer backend only writes its state into the folder it is given
(``TrainerBackend.save_checkpoint(directory)``). Layout under the checkpoint root
(``<run dir>/checkpoints`` unless ``checkpoint_dir`` is set)::

    step_<N>/          N finished training steps (the weights of weight version N)
      meta.json        written last, by the driver: backend and its facts, step, time, base model,
                       config hash, training_state, extra_state (the rollout engine's state)
      ...              whatever the backend wrote (weights, optimizer, RNG, an HF folder, ...)
    step_<N>.tmp/      a checkpoint being written: every rank writes here, and it is renamed to
                       step_<N> once every rank returned and meta.json is in it

Only folders named ``step_<N>`` that hold a ``meta.json`` are checkpoints; anything else under
the root (a shared ``checkpoint_dir``) is never touched. A run resumed from step N renames the
checkpoints of later steps to ``step_<M>.abandoned`` (they belong to the abandoned run). An
interrupted save leaves a ``.tmp`` folder that the next save of that step clears; an existing
``step_<N>`` is replaced only once the new one is complete. The root must be visible to the
driver and every trainer rank (a shared file system on several nodes).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "META_FILE",
    "CheckpointError",
    "Converted",
    "begin",
    "checkpoints_to_delete",
    "commit",
    "convert_checkpoint",
    "find_checkpoint",
    "list_checkpoints",
    "prune",
    "read_meta",
    "set_aside_later",
    "step_dir",
]

META_FILE = "meta.json"
_NAME = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """No checkpoint where one was asked for; the message says what was found."""


def step_dir(root: str | Path, step: int) -> Path:
    """The folder of step ``step``'s checkpoint under ``root`` (``step_<N>``)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return Path(root) / f"step_{step}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / META_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def read_meta(checkpoint: str | Path) -> dict[str, Any]:
    """The ``meta.json`` of one checkpoint folder."""
    path = Path(checkpoint) / META_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{checkpoint} is not a checkpoint (no {META_FILE}); "
            "pass a step_<N> folder of a run's checkpoints"
        )
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Converted:
    """A checkpoint converted to a Hugging Face folder."""

    path: Path
    """The folder written: ``transformers`` and vLLM load it."""
    adapter_only: bool
    """True for a LoRA checkpoint written as the adapter alone (PEFT's format)."""


def convert_checkpoint(checkpoint: str | Path, output: str | Path, *, merge: bool = False) -> Converted:
    """A checkpoint of either backend → a Hugging Face safetensors folder at ``output``.

    The backend that wrote it (``meta.json``'s ``backend``) converts it. A LoRA checkpoint comes
    out as the adapter alone, in PEFT's format, or with ``merge`` as the model with the adapter
    merged in. ``CheckpointError`` says what is wrong: not a checkpoint, a backend that is not
    installed, or a folder that cannot be converted.
    """
    from importlib.metadata import entry_points

    ckpt = Path(checkpoint)
    try:
        meta = read_meta(ckpt)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{ckpt / META_FILE} is not JSON ({err}): the checkpoint is damaged") from None
    backend = meta.get("backend", "fsdp")
    found = {ep.name: ep for ep in entry_points(group="telescope.trainers")}
    if backend not in found:
        raise CheckpointError(
            f"{ckpt} was written by the {backend!r} backend, which is not installed; "
            f"installed: {', '.join(sorted(found)) or 'none'}"
        )
    adapter = "lora" in meta and not merge
    options = {"adapter_only": True} if adapter else {}
    try:
        out = found[backend].load().convert_checkpoint(ckpt, Path(output), **options)
    except (FileNotFoundError, ValueError) as err:
        raise CheckpointError(f"{ckpt} could not be converted: {err}") from None
    return Converted(Path(out), adapter)


def find_checkpoint(root: str | Path, wanted: bool | int = True) -> Path:
    """The checkpoint to resume: the latest (``wanted`` true) or ``step_<wanted>``."""
    found = list_checkpoints(root)
    if not found:
        raise CheckpointError(f"resume_from_checkpoint is set but {root} holds no step_N checkpoint")
    if wanted is True:
        return found[-1][1]
    for step, path in found:
        if step == int(wanted):
            return path
    raise CheckpointError(
        f"no checkpoint step_{int(wanted)} in {root}; found: {', '.join(p.name for _, p in found)}"
    )


def begin(root: str | Path, step: int) -> Path:
    """An empty ``step_<step>.tmp`` folder for the ranks to write into (a stale one is cleared)."""
    tmp = step_dir(root, step).with_name(f"step_{step}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # left by an interrupted save
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path, step: int, meta: Mapping[str, Any]) -> Path:
    """Write ``meta.json`` into ``tmp`` and rename it to ``step_<step>`` (replacing an older one last)."""
    json.dumps(dict(meta))  # not JSON-able: fail before anything moves
    full = {**meta, "step": step, "time": time.time()}
    (tmp / META_FILE).write_text(json.dumps(full, indent=2, sort_keys=True), encoding="utf-8")
    final = tmp.with_name(f"step_{step}")
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)
    return final


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


def prune(root: str | Path, *, current: int, keep_last: int | None, keep_every: int | None) -> list[Path]:
    """Delete the checkpoints :func:`checkpoints_to_delete` names; return the deleted paths."""
    found = dict(list_checkpoints(root))
    doomed = checkpoints_to_delete(list(found), current=current, keep_last=keep_last, keep_every=keep_every)
    for s in doomed:
        shutil.rmtree(found[s])
    return [found[s] for s in doomed]


def set_aside_later(root: str | Path, step: int) -> list[Path]:
    """Rename the checkpoints of steps after ``step`` to ``step_<M>.abandoned`` (a run resumed from
    ``step`` redoes those steps: their checkpoints belong to the abandoned run and must neither be
    resumed nor count in retention). Returns the new paths; nothing is deleted."""
    moved: list[Path] = []
    for s, path in list_checkpoints(root):
        if s > step:
            target = path.with_name(f"{path.name}.abandoned")
            n = 1
            while target.exists():
                n += 1
                target = path.with_name(f"{path.name}.abandoned{n}")
            path.rename(target)
            moved.append(target)
    return moved
