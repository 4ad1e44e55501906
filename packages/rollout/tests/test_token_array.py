"""A finished sample's per-token values as compact arrays: list-like to their readers, one object
to the garbage collector; a cancelled group freed without a full pass of the collector."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest
from engine_fakes import by_sample_parity, make_engine

from telescope_rollout.engine import TokenArray
from telescope_rollout.testing import FakeInferenceServer, settle


def test_a_token_array_reads_like_the_list_it_replaces():
    ids = TokenArray.ids([5, 7, 9])
    assert ids == [5, 7, 9]
    assert ids == (5, 7, 9)
    assert ids != [5, 7]
    assert ids != [5, 7, 8]
    assert (ids != [5, 7, 9]) is False
    assert [1, *ids] == [1, 5, 7, 9]
    assert [1] + ids == [1, 5, 7, 9]  # noqa: RUF005  # a list before it: a list
    assert ids + [1] == [5, 7, 9, 1]  # noqa: RUF005
    assert ids[1:] == [7, 9]
    assert ids[1] == 7
    assert (len(ids), sum(ids), list(ids)) == (3, 21, [5, 7, 9])
    assert TokenArray.ones(3) == [1, 1, 1]
    assert TokenArray.mask([0, 1]) == [0, 1]
    assert TokenArray.logprobs([-0.5, -1.25]) == [-0.5, -1.25]  # doubles: the server's floats as sent
    assert repr(ids) == "TokenArray([5, 7, 9])"
    assert pickle.loads(pickle.dumps(ids)) == [5, 7, 9]
    with pytest.raises(TypeError):
        hash(ids)
    for same in (copy.copy(ids), copy.deepcopy(ids), ids + TokenArray.ids([1]), ids * 2, ids[:2]):
        assert isinstance(same, TokenArray)
    assert copy.deepcopy(ids) == [5, 7, 9]
    assert ids * 2 == [5, 7, 9, 5, 7, 9]


def test_a_token_array_is_one_buffer_and_the_collector_sees_none_of_its_values():
    values = TokenArray.logprobs([-0.5, -0.25])
    view = memoryview(values)  # what NumPy reads (tests/test_token_array_numpy.py)
    assert (view.format, view.itemsize) == ("d", 8)
    values[0] = -2.0
    assert view[0] == -2.0  # the same memory
    assert memoryview(TokenArray.ids([1, 2])).format == "i"
    big = TokenArray.ids(range(100_000, 100_512))
    assert gc.get_referents(big) in ([], [TokenArray])  # no slot a token to walk, its class at most
    assert len(gc.get_referents(list(big))) == 512


async def test_a_finished_sample_holds_token_arrays(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    async with make_engine(tokenizer, server) as engine:
        batch = await engine.next_batch(timeout_s=10)
    for s in batch.samples:
        assert isinstance(s.completion_ids, TokenArray)
        assert isinstance(s.completion_mask, TokenArray)
        assert isinstance(s.completion_logprobs, TokenArray)
        assert s.completion_ids == [10 + s.sample_id % 2, 3]
        assert s.completion_mask == [1, 1]
        assert s.completion_logprobs == [-0.5, -0.5]


async def test_a_cancelled_group_is_freed_without_the_garbage_collector(tokenizer):
    """A cancelled sample task's error holds its frame, which holds its group: the group drops the
    task when it ends, so nothing is left for a full collector pass to find."""
    server = FakeInferenceServer(reply=by_sample_parity, hold=lambda r: True)
    engine = make_engine(tokenizer, server)
    async with engine:
        await settle()
        group = next(iter(engine._groups.values()))
        assert len(group.tasks) == 2
        alive = weakref.ref(group)
        gc.collect()
        gc.disable()
        try:
            engine._cancel_group(group, "max_async")
            del group
            await settle()
            assert alive() is None
        finally:
            gc.enable()
