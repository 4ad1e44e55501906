"""The step timeline: hierarchical, labelled spans of what a trainer rank did, in wall-clock time.

A :class:`Timeline` belongs to one process (a trainer rank) and one thread. ``with
timeline.span("forward", microbatch=3):`` records a :class:`Span` whose ``name`` is the path of the
spans open around it (``train_step/minibatch/microbatch/forward``), with ``parent`` (the enclosing
path, ``""`` at the top), ``depth`` (0 at the top), ``start`` / ``end`` (unix seconds), the ``step``
last given to :meth:`Timeline.set_step` (-1 before any) and ``labels``: its own and those of every
enclosing span (an inner label of the same key wins), so a ``forward`` inside ``microbatch=3``
carries ``microbatch=3``.

Clocks. On a CUDA device a span is a pair of ``torch.cuda.Event(enable_timing=True)`` recorded on
the current stream: it times the GPU work queued inside it, not the host's queueing. Each batch of
spans shares one reference event, recorded with the wall time when the first span of the batch
opens (or at ``set_step``); :meth:`Timeline.drain` synchronizes the device once and converts every
finished span to wall time as ``reference wall + elapsed(reference, event)``. The reference is exact
when the stream is idle as it is recorded, which is the case at a step's start after the previous
drain (its synchronize); otherwise spans shift earlier by the queue's lag, all by the same amount.
Elsewhere (CPU) a span reads ``time.perf_counter`` anchored to ``time.time`` (monotonic, in unix
seconds; re-anchored at ``set_step`` when no span is open).

Cost: a span is two clock reads (or two events) and one small object; nothing per token. Finished
spans wait in memory until :meth:`Timeline.drain` returns and forgets them; past ``max_spans`` new
ones are dropped and counted in ``dropped``. :func:`nesting_problems` checks a drained list: each
span inside its parent, names consistent with the paths.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

__all__ = ["Label", "Span", "Timeline", "nesting_problems"]

Label = int | str
"""A span label's value: an index (``microbatch``, ``minibatch``) or a name (``server``)."""

_ROW_INTS = ("microbatch", "minibatch")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Span:
    """One finished span: a path, its place in the tree, wall-clock bounds, the step and labels."""

    name: str
    """The full path: ``parent/<name given>`` (the given name may itself hold ``/``)."""
    parent: str
    """The enclosing span's path, ``""`` at the top."""
    depth: int
    """0 at the top, parent's depth + 1 below."""
    start: float
    """Unix seconds."""
    end: float
    """Unix seconds."""
    step: int
    """The timeline's step when the span opened (-1 before any ``set_step``)."""
    labels: dict[str, Label] = field(default_factory=dict[str, Label])

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_row(self) -> dict[str, int | float | str]:
        """A flat record: step, name, parent, depth, start, end, microbatch and minibatch (-1 when
        absent), server (``""`` when absent); other labels are left out."""
        row: dict[str, int | float | str] = {
            "step": self.step,
            "name": self.name,
            "parent": self.parent,
            "depth": self.depth,
            "start": self.start,
            "end": self.end,
        }
        for key in _ROW_INTS:
            row[key] = int(self.labels.get(key, -1))
        row["server"] = str(self.labels.get("server", ""))
        return row


@dataclass(frozen=True)
class _Reference:
    """A CUDA event and the wall time at which it was recorded."""

    event: Any
    wall: float


@dataclass
class _Open:
    key: str
    name: str
    parent: str
    depth: int
    step: int
    labels: dict[str, Label]
    start: float = 0.0
    start_event: Any = None
    reference: _Reference | None = None


@dataclass(frozen=True)
class _Timed:
    """A finished CUDA span, converted to wall time at ``drain``."""

    opened: _Open
    end_event: Any


def _anchored_clock() -> Callable[[], float]:
    wall0, perf0 = time.time(), time.perf_counter()
    return lambda: wall0 + (time.perf_counter() - perf0)


class Timeline:
    """Spans of one process and thread (module docstring); ``drain`` hands them over."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        clock: Callable[[], float] | None = None,
        enabled: bool = True,
        max_spans: int = 100_000,
    ) -> None:
        """``clock``: unix seconds (default: ``perf_counter`` anchored to ``time.time``; tests pass a
        fake). ``enabled=False`` records nothing. ``max_spans``: finished spans kept until a drain."""
        self.device = torch.device(device)
        self.enabled = enabled
        self.max_spans = max_spans
        self.step = -1
        self.dropped = 0
        """Spans not kept because ``max_spans`` were waiting for a drain."""
        self._fixed_clock = clock is not None
        self._clock = clock or _anchored_clock()
        self._cuda = self.device.type == "cuda"
        self._stack: list[_Open] = []
        self._done: list[Span | _Timed] = []
        self._reference: _Reference | None = None

    def set_step(self, step: int) -> None:
        """Label the spans opened from now on with ``step`` (a train step calls it first)."""
        self.step = int(step)
        if not self.enabled or self._stack:
            return
        if not self._fixed_clock:
            self._clock = _anchored_clock()
        if self._cuda:
            self._reference = self._new_reference()

    @property
    def path(self) -> str:
        """The path of the innermost open span (``""`` when none is open)."""
        return self._stack[-1].name if self._stack else ""

    @property
    def waiting(self) -> int:
        """Finished spans waiting for :meth:`drain` (a property, not ``len``: a timeline is never falsy)."""
        return len(self._done)

    @contextlib.contextmanager
    def span(self, name: str, **labels: Label) -> Generator[None]:
        """Record the block as a span ``name`` under the open ones (closed even if it raises)."""
        if not self.enabled:
            yield
            return
        opened = self._push(name, labels)
        try:
            yield
        finally:
            self._close_through(opened)

    def open(self, name: str, **labels: Label) -> None:
        """Open a span that :meth:`close` ends (for code that cannot hold a ``with`` block)."""
        if self.enabled:
            self._push(name, labels)

    def close(self, name: str) -> None:
        """Close the innermost open span opened as ``name`` and any opened inside it; no-op if none."""
        for opened in reversed(self._stack):
            if opened.key == name:
                self._close_through(opened)
                return

    def add(self, name: str, *, start: float, end: float, **labels: Label) -> None:
        """Record a finished span with known wall-clock bounds under the open ones (e.g. a server's
        answer, timed elsewhere)."""
        if not self.enabled:
            return
        outer = self._stack[-1] if self._stack else None
        parent = outer.name if outer else ""
        merged = {**(outer.labels if outer else {}), **labels}
        span = Span(_join(parent, name), parent, len(self._stack), start, end, self.step, merged)
        self._keep(span)

    def span_iter(self, name: str, items: Iterable[_T], **labels: Label) -> Iterator[_T]:
        """``items``, with a span ``name`` from the first item asked for until the last one is out
        (or the consumer drops the iterator). Spans the consumer opens meanwhile nest inside it."""
        with self.span(name, **labels):
            yield from items

    def drain(self) -> list[Span]:
        """The finished spans (in the order they closed), forgotten here; open ones stay.

        On CUDA this synchronizes the device once, when CUDA spans are waiting.
        """
        done, self._done = self._done, []
        if not done:
            return []
        if any(isinstance(item, _Timed) for item in done):
            torch.cuda.synchronize(self.device)
            if not self._stack:
                self._reference = None  # the next span takes a fresh one
        return [item if isinstance(item, Span) else _to_span(item) for item in done]

    # -- internals ---------------------------------------------------------------------------

    def _push(self, key: str, labels: dict[str, Label]) -> _Open:
        outer = self._stack[-1] if self._stack else None
        parent = outer.name if outer else ""
        merged = {**(outer.labels if outer else {}), **labels}
        opened = _Open(key, _join(parent, key), parent, len(self._stack), self.step, merged)
        if self._cuda:
            if self._reference is None:
                self._reference = self._new_reference()
            opened.reference = self._reference
            opened.start_event = self._record_event()
        else:
            opened.start = self._clock()
        self._stack.append(opened)
        return opened

    def _close_through(self, opened: _Open) -> None:
        """Close every span above ``opened`` on the stack, then ``opened`` (if still open)."""
        if not any(o is opened for o in self._stack):
            return
        while self._stack:
            top = self._stack.pop()
            if self._cuda:
                self._keep(_Timed(top, self._record_event()))
            else:
                end = self._clock()
                self._keep(Span(top.name, top.parent, top.depth, top.start, end, top.step, top.labels))
            if top is opened:
                return

    def _keep(self, item: Span | _Timed) -> None:
        if len(self._done) >= self.max_spans:
            self.dropped += 1
        else:
            self._done.append(item)

    def _record_event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _new_reference(self) -> _Reference:
        event = self._record_event()
        return _Reference(event, self._clock())


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _to_span(item: _Timed) -> Span:
    o = item.opened
    ref = o.reference
    assert ref is not None
    start = ref.wall + float(ref.event.elapsed_time(o.start_event)) / 1000.0
    end = ref.wall + float(ref.event.elapsed_time(item.end_event)) / 1000.0
    return Span(o.name, o.parent, o.depth, start, end, o.step, o.labels)


def nesting_problems(spans: Sequence[Span], *, tolerance: float = 1e-6) -> list[str]:
    """What is wrong with the tree of ``spans`` (empty: nothing): a span that ends before it starts,
    a name that is not ``parent/...``, a depth that is not the parent's + 1, or a child whose
    ``[start, end]`` lies inside no span of its parent's name (within ``tolerance`` seconds)."""
    by_name: dict[str, list[Span]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    problems: list[str] = []
    for s in spans:
        where = f"{s.name} [{s.start:.6f}, {s.end:.6f}] (step {s.step})"
        if s.end < s.start - tolerance:
            problems.append(f"{where} ends before it starts")
        if not s.parent:
            if s.depth != 0:
                problems.append(f"{where} has no parent but depth {s.depth}")
            continue
        if not s.name.startswith(s.parent + "/"):
            problems.append(f"{where}: name is not under its parent {s.parent!r}")
        parents = [p for p in by_name.get(s.parent, []) if p.depth == s.depth - 1]
        if not parents:
            problems.append(f"{where}: no span {s.parent!r} at depth {s.depth - 1}")
        elif not any(p.start - tolerance <= s.start and s.end <= p.end + tolerance for p in parents):
            problems.append(f"{where} lies inside no {s.parent!r} span")
    return problems
