"""One copy of the math: the torch-free group advantages of ``telescope_rollout.testing`` (for rollout's
own tests and for programs that embed the engine without torch) equal ``telescope_algos.group_advantages``
(what ``telescope train`` gives the engine) for every algorithm and normalisation, invalid pairs
included."""

from __future__ import annotations

import random

import pytest

from telescope_algos import ALGORITHMS, group_advantages
from telescope_rollout import testing

NORMS = ("group", "batch")
INVALID = {("rloo", "batch"), ("dr_grpo", "batch")}


def test_both_know_the_same_algorithms():
    assert tuple(testing.ALGORITHMS) == tuple(ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("advantage_norm", NORMS)
@pytest.mark.parametrize("size", [1, 2, 5])
def test_group_advantages_match_telescope_algos(algorithm, advantage_norm, size):
    rng = random.Random(f"{algorithm}:{advantage_norm}:{size}")
    groups = [[rng.uniform(-2.0, 3.0) for _ in range(size)] for _ in range(20)]
    groups += [
        [1.0] * size,
        [float(i % 2) for i in range(size)],
        [rng.choice([0.0, 1.0]) for _ in range(size)],
    ]
    kw = {"algorithm": algorithm, "advantage_norm": advantage_norm}
    if (algorithm, advantage_norm) in INVALID:
        for fn in (group_advantages, testing.group_advantages):
            with pytest.raises(ValueError, match=f"not defined for {algorithm}"):
                fn(groups[0], **kw)
        return
    for rewards in groups:
        ours, theirs = testing.group_advantages(rewards, **kw), group_advantages(rewards, **kw)
        assert len(ours) == len(theirs) == size
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12), rewards


@pytest.mark.parametrize(("algorithm", "advantage_norm"), [("ppo", "group"), ("grpo", "token")])
def test_unknown_names_raise_in_both(algorithm, advantage_norm):
    for fn in (group_advantages, testing.group_advantages):
        with pytest.raises(ValueError, match="unknown"):
            fn([1.0, 0.0], algorithm=algorithm, advantage_norm=advantage_norm)
