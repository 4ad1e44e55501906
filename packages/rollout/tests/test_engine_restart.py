"""A dead server restarted by the caller (docs/rollout.md, "Servers that die"), driven
deterministically with the in-process fake server: servers ``a`` and ``b``, groups of 2, 2 prompts
per server (4 lane slots each), round-robin dispatch a, b, a, b."""

from __future__ import annotations

import pytest
from engine_fakes import by_sample_parity, make_engine

from telescope_rollout.testing import FakeInferenceServer, settle

A, B = "http://a", "http://b"


async def test_a_lost_server_s_groups_are_cancelled_and_their_prompts_generated_again(tokenizer):
    server = FakeInferenceServer(server_urls=[A, B], reply=by_sample_parity, hold=lambda r: True)
    events = []
    engine = make_engine(tokenizer, server)
    engine.on_event = events.append
    async with engine:
        await settle()
        # groups 0 and 2 on a, 1 and 3 on b: every lane busy
        assert sum(r.url == B for r in server.pending) == 4
        prompts_on_b = sorted({g.prompt.index for g in engine._groups.values() if g.server == B})
        assert len(prompts_on_b) == 2
        assert await engine.server_lost(B) == 2
        await settle()
        assert engine.pool.lost == {B}
        assert all(r.future is not None and r.future.cancelled() for r in server.requests if r.url == B)
        # b's prompts are handed out again, first, to a (the only server left), as new groups
        server.release(lambda r: r.url == A)
        await settle()
        again = [g for g in engine._groups.values() if g.group_id >= 4]
        assert [g.prompt.index for g in again[:2]] == prompts_on_b
        assert {g.server for g in again} == {A}
        server.hold = None
        server.release()
        got = [await engine.next_batch(timeout_s=10) for _ in range(2)]
        # the cancelled groups ride along with the reason server_restart
        cancelled = sorted((d.group.group_id, d.reason) for b in got for d in b.cancelled)
        assert cancelled == [(1, "server_restart"), (3, "server_restart")]
        assert got[0].metrics["rollout/cancelled_server_restart"] == 2.0
        # the pool's update may leave the lost server out
        engine.weights_updated(1, servers=[A])
        with pytest.raises(ValueError, match="holds weight version 0, the pool is at 1"):
            engine.server_back(B, 0)
        engine.server_back(B, 1)
        assert engine.pool.lost == set()
        assert engine.server_versions[B] == 1
        kept = []
        while not any(g.server == B for g in kept):
            kept += (await engine.next_batch(timeout_s=10)).groups
    assert {g.version_start for g in kept if g.server == B} == {1}
    kinds = [e.kind for e in events]
    assert kinds.index("server_lost") < kinds.index("server_back")
    lost = next(e for e in events if e.kind == "server_lost")
    assert lost.detail == {"servers": [B], "reason": "server_restart", "cancelled_groups": 2}


async def test_a_supervised_engine_reports_unreachable_servers_and_waits_when_all_are_down(tokenizer):
    server = FakeInferenceServer(server_urls=[A, B], reply=by_sample_parity, dead={A, B})
    engine = make_engine(tokenizer, server)
    heard: list[tuple[str, str]] = []
    engine.on_server_down = lambda url, error: heard.append((url, error))
    async with engine:
        for _ in range(20):
            await settle()
        # both reported once each and out of the pool; no RolloutError: restarting them is the
        # supervisor's concern
        assert sorted(url for url, _ in heard) == [A, B]
        assert engine.pool.lost == {A, B}
        assert engine._failed is None
        # the supervisor restarts a: it comes back, and the run goes on
        assert await engine.server_lost(A) == 0  # already out: nothing more to cancel
        server.dead.clear()
        engine.server_back(A, 0)
        batch = await engine.next_batch(timeout_s=10)
    assert {g.server for g in batch.groups} == {A}
    assert len(heard) == 2
    # the groups that met a dead server were not failed: cancelled, and their prompts generated again
    assert {d.reason for d in batch.cancelled} == {"server_restart"}
    assert batch.discarded == []
    again = {g.sample_index for g in batch.groups}
    assert again <= {d.group.sample_index for d in batch.cancelled}


async def test_a_supervisor_with_no_server_left_stops_the_engine_with_its_error(tokenizer):
    from telescope_rollout import RolloutError

    server = FakeInferenceServer(server_urls=[A, B], dead={A, B})
    engine = make_engine(tokenizer, server)
    engine.on_server_down = lambda url, error: None
    async with engine:
        engine.fail(RolloutError("no inference server left: http://a gave up after 3 restarts"))
        with pytest.raises(RolloutError, match="gave up after 3 restarts"):
            await engine.next_batch(timeout_s=10)
