"""Draining servers out of the training pool for evals and restoring them (docs/rollout.md), driven
deterministically with the in-process fake server: two servers ``a`` and ``b``, groups of 2,
2 prompts per server (4 lane slots each), round-robin dispatch a, b, a, b."""

from __future__ import annotations

import asyncio

import pytest
from engine_fakes import GatedRewardEnv, by_sample_parity, make_engine

from telescope_rollout.testing import FakeInferenceServer, sample_ids, settle

A, B = "http://a", "http://b"


def on(url: str):
    return lambda r: r.url == url


async def test_drain_cancels_in_flight_groups_and_restore_refills_the_server(tokenizer):
    server = FakeInferenceServer(server_urls=[A, B], reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server)
    async with engine:
        await settle()
        # groups 0 and 2 on a (samples 0, 1, 4, 5), 1 and 3 on b (samples 2, 3, 6, 7): every lane busy
        assert sorted(sample_ids([r for r in server.pending if r.url == B])) == [2, 3, 6, 7]
        assert engine.pool.lanes[B].busy == 4
        cancelled = await engine.drain_servers([B])
        assert cancelled == 2
        await settle()
        assert engine.pool.drained == {B}
        # b's requests were cancelled, its lanes are free, and nothing new went to it
        assert [r for r in server.pending if r.url == B] == []
        assert all(r.future is not None and r.future.cancelled() for r in server.requests if r.url == B)
        assert engine.pool.lanes[B].busy == 0
        assert len(server.requests) == 8
        # a keeps training: its groups end, new groups take its freed lanes, still nothing on b
        server.release(on(A))
        b0 = await engine.next_batch(timeout_s=10)
        b1 = await engine.next_batch(timeout_s=10)
        await settle()
        assert len(server.requests) == 12
        assert {r.url for r in server.requests[8:]} == {A}
        # the cancelled groups ride along in the next batch, with the reason
        assert [g.group_id for g in b0.groups] == [0]
        assert [g.group_id for g in b1.groups] == [2]
        drained = sorted((d.group.group_id, d.reason) for d in b0.cancelled)
        assert drained == [(1, "eval_drain"), (3, "eval_drain")]
        assert b1.cancelled == []
        for d in b0.cancelled:
            assert d.group.server == B
            assert [s.error for s in d.group.samples] == ["cancelled", "cancelled"]
        assert b0.metrics["rollout/cancelled_eval_drain"] == 2.0
        assert b0.metrics["rollout/servers_drained"] == 1.0

        # step 1's weights go to a only (b is evaluating with the old ones); b cannot come back yet
        engine.weights_updated(1, servers=[A])
        assert engine.server_versions == {A: 1, B: 0}
        with pytest.raises(ValueError, match=r"weight versions \{'http://b': 0\}"):
            engine.restore_servers([B])
        # the eval is done: b gets the current weights, then rejoins and is refilled
        engine.weights_updated(1)
        engine.restore_servers([B])
        await settle()
        assert engine.pool.drained == set()
        on_b = [r for r in server.pending if r.url == B]
        assert len(on_b) == 4  # two new groups fill b's 4 lanes
        server.hold = None
        server.release()
        kept = []
        while not any(g.server == B for g in kept):
            kept += (await engine.next_batch(timeout_s=10)).groups
    restored = [g for g in kept if g.server == B]
    for g in restored:
        assert g.version_start == 1
        assert {(s.version_start, s.version_end, s.off_policy_steps) for s in g.samples} == {(1, 1, 0)}


async def test_a_group_only_being_scored_on_a_drained_server_is_kept(tokenizer):
    gate = asyncio.Event()

    server = FakeInferenceServer(server_urls=[A, B], reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server, env=GatedRewardEnv(gate))
    async with engine:
        await settle()
        server.release(on(B))  # b's groups 1 and 3 finish generating; their rewards wait
        await settle()
        # their freed lanes took groups 4 and 5, still generating: only those are cancelled
        assert sorted(sample_ids(server.pending)) == [0, 1, 4, 5, 8, 9, 10, 11]
        assert await engine.drain_servers([B]) == 2
        gate.set()
        server.release(on(A))
        got = [await engine.next_batch(timeout_s=10) for _ in range(4)]
    assert sorted(g.group_id for b in got for g in b.groups) == [0, 1, 2, 3]
    assert sorted(d.group.group_id for b in got for d in b.cancelled) == [4, 5]


async def test_off_policy_steps_count_only_updates_a_server_received(tokenizer):
    # sample 0 (group 0, on a) is held while a gets versions 1 and 2; b is drained and gets neither
    # samples from 8 on are held too, so only a few batches fill meanwhile: were the engine to run on
    # to its async limit, group 0 could no longer be kept and would be cancelled before the updates
    server = FakeInferenceServer(
        server_urls=[A, B],
        reply=by_sample_parity,
        hold=lambda r: r.request_id == "sample-0" or sample_ids([r])[0] >= 8,
    )
    engine = make_engine(tokenizer, server, max_off_policy_steps=-1)
    async with engine:
        await settle()
        await engine.drain_servers([B])
        engine.weights_updated(1, servers=[A])
        engine.weights_updated(2, servers=[A])
        assert engine.server_versions == {A: 2, B: 0}
        server.release()
        groups = []
        while 0 not in [g.group_id for g in groups]:
            batch = await engine.next_batch(timeout_s=10)
            groups += batch.groups + [d.group for d in batch.discarded]
    g0 = next(g for g in groups if g.group_id == 0)
    assert [s.off_policy_steps for s in g0.samples] == [2, 0]
    assert [(s.version_start, s.version_end) for s in g0.samples] == [(0, 2), (0, 0)]
    assert all(s.server == A for g in groups for s in g.samples if s.version_start > 0)


def test_updates_must_reach_every_server_in_the_pool(tokenizer):
    engine = make_engine(tokenizer, FakeInferenceServer(server_urls=[A, B]))
    with pytest.raises(ValueError, match=r"servers \['http://b'\] are in the training pool"):
        engine.weights_updated(1, servers=[A])
    with pytest.raises(ValueError, match="unknown servers"):
        engine.weights_updated(1, servers=[A, B, "http://c"])
    with pytest.raises(TypeError, match="list of server URLs"):
        engine.restore_servers(B)
    engine.weights_updated(1, servers=[A, B + "/"])
    assert engine.server_versions == {A: 1, B: 1}
