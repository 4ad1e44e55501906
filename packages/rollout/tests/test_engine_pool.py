"""The engine's server bookkeeping (``ServerPool``) and the batch being filled (``Bucket``), by
hand: round robin, membership, versions; drops capped for the record, a full batch taken."""

from __future__ import annotations

import pytest

from telescope_rollout.engine import DroppedGroup, ScoredGroup, ScoredSample, ServerPool
from telescope_rollout.engine._bucket import Bucket

A, B, C = "http://a", "http://b", "http://c"


def test_servers_are_picked_round_robin_skipping_those_out_of_the_pool():
    pool = ServerPool([A, B, C], lanes_per_server=4)
    assert [pool.pick(2, per_sample=False) for _ in range(3)] == [(A, [0, 1]), (B, [0, 1]), (C, [0, 1])]
    pool.drained.add(B)
    pool.down[C] = "connection refused"
    assert pool.pick(2, per_sample=False) == (A, [2, 3])  # A's next two slots
    assert pool.pick(2, per_sample=False) is None  # A is full, B and C are out
    assert pool.pick(1, per_sample=True) is None
    pool.lost.add(A)
    assert not pool.usable(A)
    assert not pool.all_down
    pool.down.update({A: "x", B: "y"})
    assert pool.all_down


def test_an_update_must_reach_every_server_in_the_pool():
    pool = ServerPool([A, B], lanes_per_server=1)
    with pytest.raises(ValueError, match=r"servers \['http://b'\] are in the training pool"):
        pool.update(1, [A])
    pool.drained.add(B)
    assert pool.update(1, [A + "/"]) == {A: 1}
    assert pool.versions == {A: 1, B: 0}
    assert pool.behind({A, B}, 1) == {B: 0}
    pool.lost.add(B)
    assert pool.behind({A, B}, 1) == {}  # a lost server comes back through a restart
    pool.back(B, 1)
    assert (pool.versions[B], B in pool.lost) == (1, False)
    assert pool.update(3, None) == {A: 2, B: 2}
    with pytest.raises(ValueError, match="unknown servers"):
        pool.known(["http://z"])
    with pytest.raises(TypeError, match="not one string"):
        pool.known(A)


def _group(gid: int) -> ScoredGroup:
    return ScoredGroup(gid, "e", [ScoredSample(group_id=gid, sample_id=gid, env_name="e", reward=0.5)])


def test_drops_past_the_cap_are_only_counted_and_a_full_batch_is_taken():
    bucket = Bucket(2, max_recorded=1)
    for gid in range(3):
        bucket.drop(DroppedGroup(_group(gid), "zero_advantage", step=0, version=0), cancelled=False)
    bucket.drop(DroppedGroup(_group(9), "max_async", step=0, version=0), cancelled=True)
    bucket.scored("e", 0.5)
    assert not bucket.keep(_group(10))
    assert bucket.keep(_group(11))  # full
    assert bucket.keep(_group(12))  # one beyond: stays for the next batch
    progress = bucket.progress(step=4, in_flight=3)
    assert (progress.kept, progress.needed, progress.in_flight) == (3, 2, 3)
    assert (progress.dropped, progress.cancelled) == ({"zero_advantage": 3}, {"max_async": 1})
    assert (bucket.unrecorded("discarded"), bucket.unrecorded("cancelled")) == (2, 0)
    batch = bucket.take(4)
    assert [g.group_id for g in batch.groups] == [10, 11]
    assert [d.group.group_id for d in batch.discarded] == [0]
    assert [g.group_id for g in bucket.kept] == [12]
    assert (bucket.discarded, bucket.cancelled, dict(bucket.stats), bucket.rewards) == ([], [], {}, {})
