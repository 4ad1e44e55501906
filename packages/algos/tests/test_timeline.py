"""The step timeline: span paths, labels, steps and wall-clock bounds, worked by hand with a fake clock."""

from __future__ import annotations

import time

import pytest
import torch

from telescope_algos.backend import Span, StepLog, Timeline, nesting_problems


class FakeClock:
    """Unix seconds that move only when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


def _rows(spans: list[Span]) -> list[tuple[str, float, float]]:
    return [(s.name, s.start, s.end) for s in spans]


def test_spans_nest_into_paths_with_hand_worked_times():
    clock = FakeClock()
    tl = Timeline("cpu", clock=clock)
    tl.set_step(7)
    with tl.span("train_step"):  # 1000
        clock.tick()
        with tl.span("minibatch", minibatch=0):  # 1001
            clock.tick()
            with tl.span("microbatch", microbatch=2):  # 1002
                with tl.span("forward"):  # 1002
                    clock.tick()
                clock.tick(0.5)
                with tl.span("backward"):  # 1003.5
                    clock.tick(2)
            with tl.span("optimizer"):  # 1005.5
                clock.tick()
        clock.tick()
    spans = tl.drain()
    assert _rows(spans) == [
        ("train_step/minibatch/microbatch/forward", 1002.0, 1003.0),
        ("train_step/minibatch/microbatch/backward", 1003.5, 1005.5),
        ("train_step/minibatch/microbatch", 1002.0, 1005.5),
        ("train_step/minibatch/optimizer", 1005.5, 1006.5),
        ("train_step/minibatch", 1001.0, 1006.5),
        ("train_step", 1000.0, 1007.5),
    ]
    forward = spans[0]
    assert (forward.parent, forward.depth, forward.step) == ("train_step/minibatch/microbatch", 3, 7)
    assert forward.labels == {"minibatch": 0, "microbatch": 2}  # inherited from the enclosing spans
    assert (spans[-1].labels, spans[-1].parent, spans[-1].depth) == ({}, "", 0)
    assert forward.seconds == 1.0
    assert nesting_problems(spans) == []


def test_to_row_fills_absent_labels():
    span = Span("weight_sync/server", "", 0, 1.0, 2.5, 3, {"server": "http://a:8000"})
    assert span.to_row() == {
        "step": 3, "name": "weight_sync/server", "parent": "", "depth": 0, "start": 1.0, "end": 2.5,
        "microbatch": -1, "minibatch": -1, "server": "http://a:8000",
    }  # fmt: skip
    row = Span("train_step/minibatch", "train_step", 1, 0.0, 1.0, 0, {"minibatch": 1}).to_row()
    assert (row["minibatch"], row["microbatch"], row["server"]) == (1, -1, "")


def test_drain_returns_once_and_clears():
    clock = FakeClock()
    tl = Timeline(clock=clock)
    with tl.span("a"):
        clock.tick()
    assert tl.waiting == 1
    assert [s.name for s in tl.drain()] == ["a"]
    assert tl.waiting == 0
    assert tl.drain() == []


def test_open_spans_stay_until_closed_and_steps_follow_set_step():
    clock = FakeClock()
    tl = Timeline(clock=clock)
    assert tl.step == -1
    with tl.span("checkpoint/load"):  # before any step
        clock.tick()
    tl.set_step(3)
    tl.open("train_step")
    with tl.span("old_logprobs"):
        clock.tick()
    assert [s.name for s in tl.drain()] == ["checkpoint/load", "train_step/old_logprobs"]
    assert tl.path == "train_step"
    clock.tick()
    tl.close("train_step")
    (step,) = tl.drain()
    assert (step.name, step.start, step.end, step.step) == ("train_step", 1001.0, 1003.0, 3)
    assert tl.path == ""


def test_a_given_name_with_a_slash_is_a_path_of_its_own():
    clock = FakeClock()
    tl = Timeline(clock=clock)
    with tl.span("checkpoint/save"), tl.span("dcp_save"):
        clock.tick()
    inner, outer = tl.drain()
    assert (outer.name, outer.parent, outer.depth) == ("checkpoint/save", "", 0)
    assert (inner.name, inner.parent, inner.depth) == ("checkpoint/save/dcp_save", "checkpoint/save", 1)
    assert nesting_problems([inner, outer]) == []


def test_an_error_closes_the_span_and_every_span_opened_inside_it():
    clock = FakeClock()
    tl = Timeline(clock=clock)

    def fails() -> None:
        with tl.span("minibatch"):
            tl.open("microbatch", microbatch=0)
            tl.open("forward")
            clock.tick()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails()
    assert [(s.name, s.end) for s in tl.drain()] == [
        ("minibatch/microbatch/forward", 1001.0),
        ("minibatch/microbatch", 1001.0),
        ("minibatch", 1001.0),
    ]
    assert tl.path == ""
    tl.close("not open")  # a no-op


def test_close_ends_the_innermost_span_of_that_name_and_those_inside_it():
    clock = FakeClock()
    tl = Timeline(clock=clock)
    tl.open("microbatch", microbatch=0)
    tl.open("backward")
    clock.tick()
    tl.close("microbatch")
    assert [s.name for s in tl.drain()] == ["microbatch/backward", "microbatch"]


def test_add_records_a_span_timed_elsewhere_under_the_open_ones():
    tl = Timeline(clock=FakeClock())
    tl.set_step(2)
    with tl.span("weight_sync"):
        tl.add("server", start=5.0, end=6.0, server="http://a:8000")
    server = tl.drain()[0]
    assert (server.name, server.parent, server.depth) == ("weight_sync/server", "weight_sync", 1)
    assert server.step == 2
    assert (server.start, server.end, server.labels) == (5.0, 6.0, {"server": "http://a:8000"})


def test_span_iter_spans_the_whole_iteration():
    clock = FakeClock()
    tl = Timeline(clock=clock)

    def weights():
        for i in range(3):
            clock.tick()
            yield i

    assert list(tl.span_iter("hf_weights", weights())) == [0, 1, 2]
    (span,) = tl.drain()
    assert (span.name, span.start, span.end) == ("hf_weights", 1000.0, 1003.0)


def test_a_disabled_timeline_records_nothing():
    tl = Timeline(enabled=False)
    with tl.span("a"):
        tl.open("b")
        tl.add("c", start=0.0, end=1.0)
    assert tl.drain() == []


def test_past_max_spans_new_ones_are_dropped_and_counted():
    tl = Timeline(clock=FakeClock(), max_spans=2)
    for _ in range(5):
        with tl.span("a"):
            pass
    assert len(tl.drain()) == 2
    assert tl.dropped == 3


def test_nesting_problems_name_what_is_wrong():
    good = [Span("a", "", 0, 0.0, 10.0, 0), Span("a/b", "a", 1, 1.0, 2.0, 0)]
    assert nesting_problems(good) == []
    outside = [good[0], Span("a/b", "a", 1, 9.0, 11.0, 0)]
    assert "lies inside no 'a' span" in nesting_problems(outside)[0]
    orphan = [Span("x/y", "x", 1, 0.0, 1.0, 0)]
    assert "no span 'x' at depth 0" in nesting_problems(orphan)[0]
    backwards = [Span("a", "", 0, 2.0, 1.0, 0)]
    assert "ends before it starts" in nesting_problems(backwards)[0]
    misnamed = [good[0], Span("c/b", "a", 1, 1.0, 2.0, 0)]
    assert "not under its parent" in nesting_problems(misnamed)[0]


def test_the_default_clock_is_wall_time():
    tl = Timeline("cpu")
    before = time.time()
    with tl.span("a"):
        pass
    (span,) = tl.drain()
    assert before - 0.01 <= span.start <= span.end <= time.time() + 0.01


def test_step_log_timed_adds_timings_and_spans():
    clock = FakeClock()
    tl = Timeline(clock=clock)
    log = StepLog(timeline=tl)
    with tl.span("train_step"):
        with log.timed("optimizer", minibatch=1):
            clock.tick()
        with log.timed("forward_backward", span=False):
            pass
        with log.timed("optimizer"):
            clock.tick()
    assert set(log.timings) == {"timing/optimizer", "timing/forward_backward"}
    spans = tl.drain()
    assert [s.name for s in spans] == ["train_step/optimizer", "train_step/optimizer", "train_step"]
    assert spans[0].labels == {"minibatch": 1}
    plain = StepLog()  # without a timeline: timings only
    with plain.timed("optimizer"):
        pass
    assert "timing/optimizer" in plain.timings


class _FakeGpu:
    """``torch.cuda``'s events, stream and synchronize, on a fake GPU clock (seconds)."""

    def __init__(self) -> None:
        self.now = 50.0
        self.syncs = 0
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.at = 0.0

            def record(self, stream: object = None) -> None:
                self.at = gpu.now

            def elapsed_time(self, other: Event) -> float:
                assert gpu.syncs, "elapsed_time before a synchronize"
                return (other.at - self.at) * 1000.0

        self.Event = Event

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "synchronize", self._synchronize)

    def _synchronize(self, device: object = None) -> None:
        self.syncs += 1


def test_cuda_spans_convert_event_times_to_wall_time_with_one_synchronize(monkeypatch):
    gpu = _FakeGpu()
    gpu.install(monkeypatch)
    clock = FakeClock(1000.0)
    tl = Timeline(torch.device("cuda", 0), clock=clock)
    tl.set_step(4)  # the reference: GPU 50.0 <-> wall 1000.0
    clock.tick(0.25)  # the host's clock plays no part in CUDA spans
    with tl.span("train_step"):
        gpu.now += 1.0
        with tl.span("forward", microbatch=0):
            gpu.now += 2.0
        gpu.now += 0.5
    assert gpu.syncs == 0
    forward, step = tl.drain()
    assert gpu.syncs == 1
    assert (forward.name, forward.step) == ("train_step/forward", 4)
    assert (forward.start, forward.end) == (1001.0, 1003.0)
    assert (step.start, step.end) == (1000.0, 1003.5)
    assert tl.drain() == []
    assert gpu.syncs == 1  # nothing was waiting: no synchronize
    with tl.span("checkpoint/save"):  # a fresh reference after the drain: GPU 53.5 <-> wall 1000.25
        gpu.now += 1.0
    (save,) = tl.drain()
    assert (save.start, save.end, save.step) == (1000.25, 1001.25, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_spans_time_the_gpu_work_in_wall_clock():
    device = torch.device("cuda", torch.cuda.current_device())
    tl = Timeline(device)
    tl.set_step(1)
    before = time.time()
    x = torch.randn(2048, 2048, device=device)
    with tl.span("train_step"):
        with tl.span("forward"):
            for _ in range(20):
                x = x @ x / 2048
        with tl.span("backward"):
            x = x.sum()
    assert tl.waiting == 3
    spans = tl.drain()  # one synchronize
    after = time.time()
    assert [s.name for s in spans] == ["train_step/forward", "train_step/backward", "train_step"]
    assert nesting_problems(spans, tolerance=1e-4) == []
    for s in spans:
        assert before - 0.05 <= s.start <= s.end <= after + 0.05, s
    assert spans[0].seconds > 0
    assert tl.drain() == []
