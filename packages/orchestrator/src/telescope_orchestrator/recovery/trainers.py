"""Trainer ranks that die are replaced and the run goes on where it was (docs/troubleshooting.md,
"A trainer rank dies").

A rank counts as dead when a call to the ranks fails and it does not answer a ping: Ray says its
process is gone, or (only beside a rank that is gone) it is stuck in a collective with the dead
one. A call that fails while every rank answers is not a death: its error stops the run as before.
Then, holding the inference supervisor's lock (no server resync meanwhile), the loop
(``run.loop._recover_trainers``):

1. stops every rank (a collective with a dead peer never finishes) and places the group again, at
   most ``trainer_max_restarts`` times in a run;
2. the new ranks load the restore point: the last checkpoint saved with training state, else the
   checkpoint the run resumed from, else the base model (a fresh rank is the run's step 0);
3. they train again on the batches of the steps since, kept in the driver's memory by
   :class:`Replay` (the same samples, packed the same way: the ranks end exactly where the dead
   ones were; each replayed step's loss is compared with the one recorded);
4. they form the weight-sync groups with the servers that are up, and the call that failed goes
   again (the step's training, its weight update or its checkpoint).

The servers keep generating meanwhile and keep the weights they have (no update is lost: one that
broke off goes again); no step is recorded twice and no rollout is generated again. Without a
restore point worth the memory (``checkpoint_every`` false, or checkpoints without training state)
or with ``trainer_max_restarts: 0`` no batch is kept and a dead rank stops the run with a message
(:class:`TrainersGone`) that names the rank, its log's last lines and the fix.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from telescope_orchestrator.record.logging import log_tail

if TYPE_CHECKING:
    import numpy as np

    from telescope_config import TelescopeConfig

__all__ = ["Replay", "TrainerRestarts", "TrainersGone", "dead_ranks", "why_no_restarts"]

log = structlog.get_logger()

PING_S = 10.0
"""How long a rank has to answer a ping after a call to the ranks failed."""
CHECKED = ("loss",)
"""The trainer metrics a replayed step must reproduce (``replay_max_diff`` in the restart event)."""
LOG_LINES = 15
"""Lines of a dead rank's log quoted when the run stops."""


class TrainersGone(RuntimeError):
    """A trainer rank died and the ranks are not restarted; the message says why and what to do."""


@dataclass(frozen=True)
class _Kept:
    """One training sample in ~10 bytes a token (``TrainingSample`` holds Python ints and floats)."""

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    advantage: float
    rollout_logprobs: np.ndarray | None
    completion_mask: np.ndarray | None
    teacher_logprobs: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None

    @classmethod
    def of(cls, s: Any) -> _Kept:
        import numpy as np

        return cls(
            np.array(s.prompt_ids, dtype=np.int32),  # copies: a sample's TokenArray is not shared
            np.array(s.completion_ids, dtype=np.int32),
            float(s.advantage),
            _floats(s.rollout_logprobs),
            None if s.completion_mask is None else np.array(s.completion_mask, dtype=np.int8),
            _floats(s.teacher_logprobs),
            _floats(s.ref_logprobs),
        )

    def sample(self) -> Any:
        from telescope_algos import TrainingSample

        def listed(a: np.ndarray | None) -> list[Any] | None:
            return None if a is None else a.tolist()

        return TrainingSample(
            prompt_ids=self.prompt_ids.tolist(),
            completion_ids=self.completion_ids.tolist(),
            advantage=self.advantage,
            rollout_logprobs=listed(self.rollout_logprobs),
            completion_mask=listed(self.completion_mask),
            teacher_logprobs=listed(self.teacher_logprobs),
            ref_logprobs=listed(self.ref_logprobs),
        )

    @property
    def nbytes(self) -> int:
        arrays = (
            self.prompt_ids,
            self.completion_ids,
            self.rollout_logprobs,
            self.completion_mask,
            self.teacher_logprobs,
            self.ref_logprobs,
        )
        return sum(a.nbytes for a in arrays if a is not None)


def _floats(values: Any) -> np.ndarray | None:
    """A copy of ``values`` as packing takes logprobs (:func:`telescope_algos.logprob_array`)."""
    from telescope_algos import logprob_array

    if values is None:
        return None
    out = logprob_array(values)
    return out if out.base is None else out.copy()  # a float32 buffer is read, not converted


@dataclass
class Replay:
    """The samples of each step trained since the restore point, and the trainer metrics recorded
    for it, to train them again on restarted ranks."""

    steps: list[tuple[int, list[_Kept], dict[str, float]]] = field(
        default_factory=list[tuple[int, list[_Kept], dict[str, float]]]
    )

    def add(self, step: int, samples: Sequence[Any], metrics: dict[str, float]) -> None:
        """Step ``step`` was trained on ``samples`` (``TrainingSample``) with ``metrics`` (rank 0's)."""
        kept = {k: float(metrics[k]) for k in CHECKED if k in metrics}
        self.steps = [s for s in self.steps if s[0] < step]  # a step trained again replaces itself
        self.steps.append((step, [_Kept.of(s) for s in samples], kept))

    def clear(self) -> None:
        """A new restore point: nothing before it is needed."""
        self.steps = []

    def __iter__(self) -> Iterator[tuple[int, list[Any], dict[str, float]]]:
        for step, kept, metrics in self.steps:
            yield step, [k.sample() for k in kept], metrics

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes for _, kept, _ in self.steps for k in kept)


def replay_diff(recorded: dict[str, float], again: dict[str, float]) -> float:
    """The largest absolute difference of the checked metrics between a step and its replay (0.0
    when they match; ``inf`` when one is missing or not finite on one side only)."""
    worst = 0.0
    for key, value in recorded.items():
        other = again.get(key)
        if other is None:
            return math.inf
        if math.isnan(value) and math.isnan(other):
            continue
        diff = abs(float(other) - value)
        if math.isnan(diff):  # not a number on one side only
            return math.inf
        worst = max(worst, diff)
    return worst


async def dead_ranks(trainers: Sequence[Any]) -> dict[int, str]:
    """After a call to the ranks failed: the ranks that died, with why, and beside them those that
    do not answer within :data:`PING_S` (stuck in a collective with a dead peer). ``{}`` when no
    rank died: the failure is the call's own."""
    from telescope_orchestrator.cluster.calls import ping

    found = await asyncio.gather(*[ping(a, PING_S) for a in trainers])
    if not any(w is not None and w != "hung" for w in found):
        return {}
    return {
        rank: w if w != "hung" else f"did not answer within {PING_S:.0f} s"
        for rank, w in enumerate(found)
        if w is not None
    }


@dataclass
class TrainerRestarts:
    """What a restart of the trainer ranks needs, and its count (see the module docstring)."""

    config: TelescopeConfig
    place: Callable[[], list[Any]]
    """Kill the ranks, place new ones and set them up (blocking; ``run.startup``)."""
    connect: Callable[[list[Any], dict[str, list[str]] | None], None]
    """Form the weight-sync groups between new ranks and the servers given (None: every server;
    blocking; ``run.startup``)."""
    log_dir: Path
    event: Callable[..., None]
    say: Callable[[str], None]
    restore_from: str | None = None
    """The checkpoint the ranks load (None: the base model)."""
    restore_step: int = 0
    replay: Replay = field(default_factory=Replay)
    restarts: int = 0

    @property
    def why_not(self) -> str | None:
        """Why this run cannot restart its ranks (None: it can)."""
        return why_no_restarts(self.config)

    def trained(self, step: int, samples: Sequence[Any], metrics: dict[str, float]) -> None:
        """Step ``step`` was trained: keep its samples for a replay (when the ranks can restart)."""
        if self.why_not is None:
            self.replay.add(step, samples, metrics)

    def checkpointed(self, step: int, path: str) -> None:
        """A checkpoint with training state: the new restore point."""
        if self.config.checkpoint_save_training_state:
            self.restore_from, self.restore_step = path, step
            self.replay.clear()

    def lost(self, dead: dict[int, str], what: str) -> None:
        """Ranks died during ``what``: an event and a console line; raises :class:`TrainersGone`
        when they are not restarted."""
        self.restarts += 1
        ranks = ", ".join(f"rank {r}: {w}" for r, w in sorted(dead.items()))
        self.event(
            "trainer_lost", dead={str(r): w for r, w in dead.items()}, during=what, restarts=self.restarts - 1
        )
        log.error("trainer ranks died", dead=dead, during=what, restarts=self.restarts - 1)
        limit = int(self.config.trainer_max_restarts)
        stop = self.why_not or (
            f"they died {self.restarts} times (trainer_max_restarts: {limit})"
            if self.restarts > limit
            else None
        )
        if stop is not None:
            raise TrainersGone(self._report(dead, what, stop))
        self.say(
            f"[yellow]trainer {ranks} during {what}[/yellow]: restarting the trainer ranks from "
            f"{self.point()} ({self.restarts}/{limit})"
        )
        self.event(
            "trainer_restarting",
            attempt=self.restarts,
            from_step=self.restore_step,
            checkpoint=self.restore_from,
            replay=[s for s, _, _ in self.replay.steps],
        )

    def point(self) -> str:
        return f"the checkpoint of step {self.restore_step}" if self.restore_from else "the base model"

    def back(self, seconds: float, diffs: dict[int, float]) -> None:
        worst = max(diffs.values(), default=0.0)
        self.event(
            "trainer_restarted",
            attempt=self.restarts,
            seconds=seconds,
            from_step=self.restore_step,
            replayed=sorted(diffs),
            replay_max_diff=worst,
        )
        log.info(
            "trainer ranks back", seconds=round(seconds, 1), replayed=sorted(diffs), replay_max_diff=worst
        )
        if worst > 1e-4:
            log.warning("a replayed step differs from its record", diffs=diffs)
        steps = (
            ""
            if not diffs
            else (
                f", step {min(diffs)} trained again"
                if len(diffs) == 1
                else f", steps {min(diffs)}-{max(diffs)} trained again"
            )
        )
        self.say(f"trainer ranks are back ({seconds:.0f} s{steps})")

    def _report(self, dead: dict[int, str], what: str, stop: str) -> str:
        lines = [f"trainer rank {r} died during {what}: {w}" for r, w in sorted(dead.items())]
        for rank in sorted(dead):
            path = self.log_dir / f"rank_{rank}.log"
            tail = log_tail(path, 200_000, lines=LOG_LINES)
            if tail:
                lines.append(f"last lines of {path}:\n{tail}")
        then = (
            f"The last checkpoint is of step {self.restore_step} ({self.restore_from}): fix the cause above, "
            "then resume the run with --resume_from_checkpoint true."
            if self.restore_from
            else "The run has no checkpoint: fix the cause above, then start it again."
        )
        lines.append(f"The ranks are not restarted: {stop}.\n{then}")
        return "\n".join(lines)


def why_no_restarts(cfg: TelescopeConfig) -> str | None:
    """Why a run with config ``cfg`` cannot restart dead trainer ranks (None: it can; decided by the
    config alone, so before any rank is placed)."""
    if int(cfg.trainer_max_restarts) <= 0:
        return "trainer_max_restarts is 0"
    if not cfg.checkpoint_every:
        return (
            "this run saves no checkpoint to restart them from (checkpoint_every: false): set "
            "checkpoint_every for a run to survive a trainer rank"
        )
    if not cfg.checkpoint_save_training_state:
        return (
            "its checkpoints hold no training state (checkpoint_save_training_state: false): set it "
            "true for a run to survive a trainer rank"
        )
    return None
