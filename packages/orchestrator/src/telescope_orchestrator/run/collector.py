"""The cyclic garbage collector during a run's steps, kept out of the event loop's way.

CPython runs a full pass of its collector whenever the objects that outlived its young passes grow
by a quarter. A step of 8,192 samples keeps about a million objects alive for a while (the samples
in flight and their tasks, the batch being packed and recorded), so full passes came about ten
times a step, each holding the event loop, and with it every server's next request, for 0.3 to
1.3 s: about 40% of the driver's CPU (tools/bench_scale.py). What the steps leave behind is freed
by reference counting (the engine breaks the cycle a cancelled sample's task made), so during the
steps (:func:`steps_collector`):

* what start-up built (torch, transformers, the datasets, the engine) is frozen out of every pass;
* young passes run after :data:`YOUNG_PASS` new objects (CPython's default: 700): fewer, each
  still short, as it looks at the new objects only;
* full passes run only where :func:`between_steps` runs one: after every :data:`FULL_PASS_EVERY`
  th step, between two steps.

Everything is given back when the steps end: a Python program that runs ``train`` keeps its own
collector settings.
"""

from __future__ import annotations

import gc
from collections.abc import Generator
from contextlib import contextmanager

import structlog

__all__ = ["FULL_PASS_EVERY", "YOUNG_PASS", "between_steps", "steps_collector"]

log = structlog.get_logger()

YOUNG_PASS = 3_000
"""New objects between two young passes during the steps."""
FULL_PASS_EVERY = 10
"""Steps between two full passes."""
_NEVER = 1_000_000_000
"""A third threshold no run reaches: no full pass but ours."""


@contextmanager
def steps_collector() -> Generator[None]:
    """The collector as the steps need it (module docstring), CPython's settings back after them."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_PASS, before[1], _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def between_steps(step: int) -> bool:
    """A full pass after step ``step`` when it is due (every :data:`FULL_PASS_EVERY` steps);
    returns whether one ran."""
    if step % FULL_PASS_EVERY:
        return False
    freed = gc.collect()
    log.debug("full garbage collection", step=step, freed=freed)
    return True
