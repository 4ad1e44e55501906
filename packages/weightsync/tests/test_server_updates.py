"""What ``publish`` keeps of an update's timeline: one ``ServerUpdate`` per server and the sender's
phases (``publish_spans``), in wall-clock seconds.

The servers and the broadcast are fakes (as in test_publish_errors.py): each server's
``telescope_receive`` answers after a delay the test chooses, so the recorded times can be checked.
"""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from telescope_weightsync import PublisherSettings, PublishSpan, ServerError, ServerUpdate, WeightPublisher
from telescope_weightsync import _publisher as publisher_module
from telescope_weightsync._stream import StreamStats

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
WEIGHTS = [("w", torch.ones(4))]
STREAM_S = 0.05


class _FakeGroup:
    device = torch.device("cpu")

    def close(self) -> None:
        pass


@pytest.fixture
def pub(monkeypatch):
    """A publisher with group ``full`` of servers A and B, connected in name only, whose stream
    takes ``STREAM_S``."""
    pub = WeightPublisher([A, B], PublisherSettings(backend="gloo", timeout_s=5.0))
    pub._client = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"results": [{}]}))
    )
    pub._groups["full"] = _FakeGroup()  # pyright: ignore[reportArgumentType] (a stand-in)
    pub._members["full"] = [A, B]
    pub._layouts["full"] = []

    def send_update(group, buckets, cache, scratch):
        for _ in buckets:
            pass
        time.sleep(STREAM_S)
        return StreamStats(bytes=16, buckets=1, tensors=1)

    monkeypatch.setattr(publisher_module, "send_update", send_update)
    yield pub
    pub.close()


def _servers(monkeypatch, pub, answers):
    """``answers[url](payload)``: that server's results (or an error), after its own delay."""
    monkeypatch.setattr(pub, "_rpc", lambda url, method, payload, timeout_s: answers[url](payload))


def _answer(delay_s, workers):
    def answer(payload):
        time.sleep(delay_s)
        return [{"version": payload["version"], **w} for w in workers]

    return answer


def test_each_server_gets_its_request_and_answer_times_and_slowest_worker(monkeypatch, pub):
    _servers(
        monkeypatch,
        pub,
        {
            A: _answer(0.02, [{"seconds": 0.01, "wait_s": 0.002}]),
            B: _answer(0.2, [{"seconds": 0.03, "wait_s": 0.001}, {"seconds": 0.05, "wait_s": 0.004}]),
        },
    )
    before = time.time()
    metrics = pub.publish(WEIGHTS, version=7)
    after = time.time()
    assert metrics["apply_seconds_max"] == 0.05  # the return value is as before
    a, b = pub.last_update
    assert isinstance(a, ServerUpdate)
    assert (a.server, a.group, a.version, a.apply_s, a.wait_s) == (A, "full", 7, 0.01, 0.002)
    assert (b.server, b.group, b.version, b.apply_s, b.wait_s) == (B, "full", 7, 0.05, 0.004)
    for u in (a, b):
        assert before <= u.start <= u.end <= after
    assert a.end - a.start >= 0.02
    assert b.end - b.start >= 0.2
    assert b.end > a.end


def test_the_senders_phases_nest_in_the_publish_span(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _answer(0.0, [{}]), B: _answer(0.2, [{}])})
    before = time.time()
    pub.publish(WEIGHTS, version=1)
    after = time.time()
    spans = {s.name: s for s in pub.publish_spans}
    assert all(isinstance(s, PublishSpan) for s in pub.publish_spans)
    assert list(spans) == ["publish/trigger", "publish/stream", "publish/wait", "publish"]
    whole, trigger, stream, wait = (
        spans[n] for n in ("publish", "publish/trigger", "publish/stream", "publish/wait")
    )
    assert before <= whole.start == trigger.start <= trigger.end == stream.start
    assert stream.end == wait.start <= wait.end == whole.end <= after
    assert stream.end - stream.start >= STREAM_S
    # the stream overlapped B's 0.2 s; the rest is the wait for its answer
    (b,) = [u for u in pub.last_update if u.server == B]
    assert wait.end >= b.end >= wait.start


def test_a_failed_update_leaves_no_timeline(monkeypatch, pub):
    _servers(monkeypatch, pub, {A: _answer(0.0, [{}]), B: _answer(0.0, [{}])})
    pub.publish(WEIGHTS, version=1)
    assert len(pub.last_update) == 2
    _servers(monkeypatch, pub, {A: _answer(0.0, [{}]), B: lambda payload: [{"version": 0}]})
    with pytest.raises(ServerError, match="report versions"):
        pub.publish(WEIGHTS, version=2)
    assert pub.last_update == []
    assert pub.publish_spans == []


def test_before_any_update_the_timeline_is_empty():
    pub = WeightPublisher([A], PublisherSettings(backend="gloo"))
    try:
        assert (pub.last_update, pub.publish_spans) == ([], [])
    finally:
        pub.close()
