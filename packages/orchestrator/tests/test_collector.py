"""The garbage collector during a run's steps (``run.collector``)."""

from __future__ import annotations

import gc

from telescope_orchestrator.run.collector import FULL_PASS_EVERY, YOUNG_PASS, between_steps, steps_collector


def test_the_steps_get_their_settings_and_give_the_program_its_own_back():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with steps_collector():
            young, middle, full = gc.get_threshold()
            assert (young, middle) == (YOUNG_PASS, 10)
            assert full >= 10**9  # no full pass but between_steps'
            assert gc.get_freeze_count() > 0  # what was built before the steps is left out
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*before)


def test_a_full_pass_runs_between_steps_every_few_steps_and_frees_cycles():
    passes: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            passes.append(1)

    class Node:
        other: object = None

    gc.callbacks.append(seen)
    try:
        with steps_collector():
            ran = [step for step in range(1, 2 * FULL_PASS_EVERY + 1) if between_steps(step)]
            a, b = Node(), Node()
            a.other, b.other = b, a  # a cycle: only a full pass frees it
            count = len(passes)
            del a, b
            assert between_steps(FULL_PASS_EVERY) is True
            assert len(passes) == count + 1
            assert not [o for o in gc.get_objects() if isinstance(o, Node)]
    finally:
        gc.callbacks.remove(seen)
    assert ran == [FULL_PASS_EVERY, 2 * FULL_PASS_EVERY]
