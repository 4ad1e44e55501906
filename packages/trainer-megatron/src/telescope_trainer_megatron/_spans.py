"""The micro-batch spans of one call of Megatron's forward-backward schedule.

Megatron's schedule, not the trainer, loops over the micro-batches: it calls the trainer's
``forward_step`` (the model), then its ``loss_func``, then runs the backward pass itself, and after
the last micro-batch ``finalize_model_grads`` (the data-parallel gradient reduction). The trainer
marks the callbacks (:meth:`MicroBatchSpans.forward`, :meth:`MicroBatchSpans.loss`) and the
finalize hook (:meth:`MicroBatchSpans.finish`); this class turns those marks into spans:

- without pipeline parallelism (one stage: forward, loss, backward of a micro-batch in turn) a
  ``microbatch`` span (label ``microbatch``) holds ``forward``, ``loss`` and ``backward``; the
  backward span runs from the end of the loss until the next micro-batch's forward starts (or the
  gradient reduction, or the schedule's end);
- with pipeline parallelism the schedule interleaves the micro-batches' forwards and backwards
  (and a stage that is not the last computes no loss), so only ``forward`` and ``loss`` (each with
  label ``microbatch``) are spans, directly inside the enclosing span: backward time is the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence

from telescope_algos.backend import Timeline

__all__ = ["MicroBatchSpans"]


class MicroBatchSpans:
    """Spans of the micro-batches ``indices`` (their indices in the step) through one schedule call."""

    def __init__(
        self, timeline: Timeline, indices: Sequence[int], *, backward: bool, pipelined: bool
    ) -> None:
        self._timeline = timeline
        self._indices = list(indices)
        self._count = 0
        self._current = -1
        self._open = False
        self._pipelined = pipelined
        self._backward = backward and not pipelined

    @contextlib.contextmanager
    def forward(self) -> Generator[None]:
        """Around the model's forward of the next micro-batch."""
        self.finish()
        k = self._count
        self._current = self._indices[k] if k < len(self._indices) else k
        self._count += 1
        if self._pipelined:
            with self._timeline.span("forward", microbatch=self._current):
                yield
            return
        self._timeline.open("microbatch", microbatch=self._current)
        self._open = True
        with self._timeline.span("forward"):
            yield

    @contextlib.contextmanager
    def loss(self) -> Generator[None]:
        """Around the loss of the micro-batch whose forward ran last; its backward follows."""
        if self._pipelined:
            with self._timeline.span("loss", microbatch=self._current):
                yield
            return
        with self._timeline.span("loss"):
            yield
        if self._backward:
            self._timeline.open("backward")
        else:
            self.finish()

    def finish(self) -> None:
        """Close the open micro-batch (and its backward), if any (idempotent)."""
        if self._open:
            self._open = False
            self._timeline.close("microbatch")
