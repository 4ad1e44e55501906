"""Which error ``publish`` raises, decided by type: a server's own failure is blamed first.

The servers and the broadcast are fakes: each server's ``telescope_receive`` call and the
sender's stream are replaced, so every path of the decision runs in milliseconds.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import httpx
import pytest
import torch

from telescope_weightsync import (
    GroupError,
    PublisherSettings,
    ReceiverMissing,
    ServerError,
    ServerTimeout,
    UpdateError,
    WeightPublisher,
)
from telescope_weightsync import _publisher as publisher_module
from telescope_weightsync._stream import StreamStats

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
WEIGHTS = [("w", torch.ones(4))]


class _FakeGroup:
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def pub(monkeypatch):
    """A publisher with group ``full`` of servers A and B, connected in name only."""
    pub = WeightPublisher([A, B], PublisherSettings(backend="gloo", timeout_s=0.5))
    leave = httpx.MockTransport(lambda request: httpx.Response(200, json={"results": [{}]}))
    pub._client = httpx.Client(transport=leave)
    pub._groups["full"] = cast(Any, _FakeGroup())
    pub._members["full"] = [A, B]
    pub._layouts["full"] = []
    yield pub
    pub.close()


def _servers(monkeypatch, pub, answers):
    """Each server's ``telescope_receive``: a callable returning its results or raising."""
    monkeypatch.setattr(pub, "_rpc", lambda url, method, payload, timeout_s: answers[url](payload))


def _sender(monkeypatch, error=None):
    def send_update(group, buckets, cache, scratch):
        for _ in buckets:
            pass
        if error is not None:
            raise error
        return StreamStats(bytes=16, buckets=1, tensors=1)

    monkeypatch.setattr(publisher_module, "send_update", send_update)


def _applied(payload):
    return [{"version": payload["version"], "seconds": 0.01}]


def _fails(message):
    def answer(payload):
        raise ServerError(B, message)

    return answer


def test_a_clean_update_returns_its_metrics(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _applied, B: _applied})
    _sender(monkeypatch)
    metrics = pub.publish(WEIGHTS, version=4)
    assert metrics["bytes"] == 16.0
    assert metrics["apply_seconds_max"] == 0.01
    assert "full" in pub._groups


def test_a_server_that_fails_to_apply_is_named_and_the_group_dropped(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _applied, B: _fails("worker raised KeyError")})
    _sender(monkeypatch)
    with pytest.raises(ServerError, match="failed to apply version 4: worker raised KeyError") as info:
        pub.publish(WEIGHTS, version=4)
    assert info.value.server == B
    assert "full" not in pub._groups


def test_a_failed_broadcast_blames_the_server_that_died(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _applied, B: _fails("connection reset")})
    _sender(monkeypatch, GroupError("group 'full' rank 0/3: broadcast of bucket 0 failed"))
    with pytest.raises(
        ServerError, match=r"failed during update 4: connection reset \(sender: group"
    ) as info:
        pub.publish(WEIGHTS, version=4)
    assert info.value.server == B
    assert isinstance(info.value.__cause__, GroupError)
    assert "full" not in pub._groups


@pytest.fixture
def hangs():
    """A server that answers only once the test is over (or after 5 s)."""
    release = threading.Event()

    def answer(payload):
        release.wait(5)
        return _applied(payload)

    yield answer
    release.set()


def test_a_failed_broadcast_with_no_server_to_blame_names_the_group(monkeypatch, pub, hangs):
    _servers(monkeypatch, pub, {A: hangs, B: hangs})
    _sender(monkeypatch, GroupError("broadcast of bucket 0 failed"))
    with pytest.raises(
        UpdateError, match=r"update 4 on group 'full' \(\[.*10\.0\.0\.2.*\]\) failed: broadcast"
    ):
        pub.publish(WEIGHTS, version=4)
    assert "full" not in pub._groups


def test_servers_that_do_not_apply_in_time_are_listed(monkeypatch, pub, hangs):
    _servers(monkeypatch, pub, {A: _applied, B: hangs})
    _sender(monkeypatch)
    with pytest.raises(UpdateError, match=r"servers \['http://10\.0\.0\.2:8000'\] did not apply version 4"):
        pub.publish(WEIGHTS, version=4)


def test_the_weight_iterator_error_propagates_unchanged(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _applied, B: _applied})
    _sender(monkeypatch, ValueError("the trainer's gather failed"))
    with pytest.raises(ValueError, match="gather failed"):
        pub.publish(WEIGHTS, version=4)
    assert "full" not in pub._groups


def test_a_wrong_version_names_the_server_and_keeps_the_group(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _applied, B: lambda payload: [{"version": 3}]})
    _sender(monkeypatch)
    with pytest.raises(ServerError, match="report versions") as info:
        pub.publish(WEIGHTS, version=4)
    assert info.value.server == B
    assert "full" in pub._groups


def test_an_unknown_group_says_how_to_recover(pub):
    with pytest.raises(GroupError, match="call connect\\(\\) again"):
        pub.publish(WEIGHTS, version=1, group="training_only")


@pytest.mark.parametrize("cls", [ServerError, ServerTimeout, ReceiverMissing])
def test_server_errors_cross_a_process_boundary_whole(cls):
    # a trainer actor's publish raises these in another process: Ray pickles them to the driver
    import pickle

    err = pickle.loads(pickle.dumps(cls("http://127.0.0.1:8100", "update failed: out of memory")))
    assert type(err) is cls
    assert err.server == "http://127.0.0.1:8100"
    assert str(err) == "update failed: out of memory"


def test_connect_again_asks_only_the_named_servers_and_replaces_the_group(monkeypatch):
    # a dead server (B) is left out of the groups: connecting again must not need its answer
    pub = WeightPublisher([A, B], PublisherSettings(backend="gloo", timeout_s=5))
    asked: list[tuple[str, str]] = []
    joined: list[str] = []

    def rpc(url, method, payload, timeout_s):
        asked.append((url, method))
        if method == "telescope_join":
            joined.append(payload["prefix"])
        if url == B:
            raise ServerError(B, "connection refused")
        return [{"tp_rank": 0, "tp_size": 1, "rank": payload["rank_offset"]}] if payload else [{}]

    class Store:
        class underlying_store:
            port = 1234

    made: list[_FakeGroup] = []

    def make_group(store, **kwargs):
        made.append(_FakeGroup())
        return made[-1]

    monkeypatch.setattr(pub, "_rpc", rpc)
    prefixes: list[str] = []

    def open_store(*args, prefix, **kwargs):
        prefixes.append(prefix)
        return Store()

    monkeypatch.setattr(publisher_module, "open_store", open_store)
    monkeypatch.setattr(publisher_module, "make_group", make_group)
    pub._client = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"results": [{}]}))
    )
    try:
        pub.connect({"full": [A]})
        pub.connect({"full": [A], "restart": [A]})
        assert {url for url, _ in asked} == {A}
        # every forming rendezvous under keys of its own (a group formed again must not read the
        # addresses of the dead server its earlier forming left in the store); the joins carry them
        formed = [p for p in prefixes if p != "telescope/"]
        assert formed == ["telescope/full/1/", "telescope/full/2/", "telescope/restart/3/"]
        assert joined == formed
        assert made[0].closed  # the first "full" was replaced
        assert pub.group_ranks("full") == {A: [1]}
        assert pub.group_ranks("restart") == {A: [1]}
        pub.disconnect("restart")
        with pytest.raises(GroupError, match="'restart' is not connected"):
            pub.group_ranks("restart")
        pub.disconnect("restart")  # again: nothing to do
    finally:
        pub.close()
