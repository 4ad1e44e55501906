"""Send and receive one weight update over a :class:`Group` (format in ``_protocol``).

Both sides keep a per-group list of bucket layouts from the previous update; a bucket whose
layout is unchanged travels without its JSON layout (``meta_len == 0``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from telescope_weightsync._errors import StreamError
from telescope_weightsync._protocol import (
    HEADER_LEN,
    OP_ABORT,
    OP_BUCKET,
    OP_END,
    Bucket,
    Layout,
    header,
)
from telescope_weightsync._transport import Group


@dataclass
class StreamStats:
    """What one update moved: payload bytes, buckets, tensors and layouts re-sent."""

    bytes: int = 0
    buckets: int = 0
    tensors: int = 0
    layouts_sent: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    """Receiver only: time the consumer (the apply) waited for the next bucket."""
    extra: dict[str, float] = field(default_factory=dict[str, float])


class Scratch:
    """Reusable flat send buffers, one per dtype, grown on demand.

    The publisher keeps one per group across updates: a fresh 256 MiB host buffer costs its page
    faults again on every update (about 0.3 s per 500 MB on the 2-core CI machine).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def flat(self, layout: Layout) -> torch.Tensor:
        buf = self.buffers.get(layout.dtype)
        if buf is None or buf.numel() < layout.numel:
            self.buffers.pop(layout.dtype, None)
            buf = self.buffers[layout.dtype] = torch.empty(
                layout.numel, dtype=layout.dtype, device=self.device
            )
        return buf[: layout.numel]


def copy_flat(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[:] = src.reshape(-1)`` (same dtype); between host tensors a single-threaded memcpy.

    torch's CPU ``copy_`` runs an OpenMP team per call; on a few cores shared with vLLM workers
    its threads spin against each other: flattening SmolLM2-135M (513 MiB) took 0.8 to 1.6 s
    with 2 threads against 0.1 to 0.2 s as one memcpy (measured on the 2-core CI machine).
    """
    src = src.detach()
    if dst.device.type == "cpu" and src.device.type == "cpu" and src.is_contiguous() and src.numel():
        np.copyto(dst.view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src.reshape(-1), non_blocking=True)


def _bucket_payload(bucket: Bucket, group: Group, scratch: Scratch) -> torch.Tensor:
    if len(bucket.tensors) == 1:
        tensor = bucket.tensors[0].detach()
        if tensor.device == group.device and tensor.is_contiguous():
            return tensor.view(-1)
    flat = scratch.flat(bucket.layout)
    for entry, tensor in zip(bucket.layout.entries, bucket.tensors, strict=True):
        copy_flat(flat[entry.offset : entry.offset + entry.numel], tensor)
    if flat.device.type == "cuda":
        torch.cuda.current_stream(flat.device).synchronize()
    return flat


def send_update(
    group: Group, buckets: Iterable[Bucket], cache: list[Layout], scratch: Scratch | None = None
) -> StreamStats:
    """Broadcast every bucket then the end marker; update ``cache`` with the layouts sent.

    ``scratch`` holds the flat buffers of ``flattened_bucket`` mode (a fresh one if ``None``).

    If ``buckets`` raises (the trainer's weight iterator failed), receivers get ``OP_ABORT`` so
    they stop at once, and the iterator's exception propagates.
    """
    stats = StreamStats()
    start = time.perf_counter()
    scratch = scratch if scratch is not None else Scratch(group.device)
    index = 0
    iterator = iter(buckets)
    while True:
        try:
            bucket = next(iterator)
        except StopIteration:
            break
        except BaseException:
            group.broadcast(header(OP_ABORT, index).to(group.device), what="the abort marker")
            raise
        layout = bucket.layout
        cached = index < len(cache) and cache[index] == layout
        meta = b"" if cached else layout.to_bytes()
        group.broadcast(
            header(OP_BUCKET, index, len(meta), layout.numel).to(group.device), what=f"header {index}"
        )
        if meta:
            raw = torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(group.device)
            group.broadcast(raw, what=f"layout of bucket {index}")
            stats.layouts_sent += 1
            del cache[index:]
            cache.append(layout)
        group.broadcast(
            _bucket_payload(bucket, group, scratch), what=f"bucket {index} ({layout.nbytes} bytes)"
        )
        stats.bytes += layout.nbytes
        stats.tensors += len(layout.entries)
        index += 1
    group.broadcast(header(OP_END, index).to(group.device), what="the end marker")
    del cache[index:]
    stats.buckets = index
    stats.seconds = time.perf_counter() - start
    return stats


def _receive_buckets(
    group: Group, cache: list[Layout], stats: StreamStats
) -> Iterator[tuple[Layout, torch.Tensor]]:
    """Receive ``(layout, flat buffer)`` per bucket until the end marker; fill ``stats``."""
    start = time.perf_counter()
    expected = 0
    while True:
        head = torch.zeros(HEADER_LEN, dtype=torch.int64, device=group.device)
        group.broadcast(head, what=f"header {expected}")
        # torch's stub types tolist() as a bare list
        values = cast(list[int], head.tolist())  # pyright: ignore[reportUnknownMemberType]
        op, index, meta_len, numel = values
        if op == OP_END:
            if index != expected:
                raise StreamError(f"update ended after {expected} buckets but the sender counted {index}")
            del cache[index:]
            break
        if op == OP_ABORT:
            raise StreamError(
                f"the publisher aborted the update after {expected} buckets (its weights failed)"
            )
        if op != OP_BUCKET or index != expected:
            raise StreamError(f"protocol error: got op {op} index {index}, expected bucket {expected}")
        if meta_len:
            raw = torch.empty(meta_len, dtype=torch.uint8, device=group.device)
            group.broadcast(raw, what=f"layout of bucket {index}")
            layout = Layout.from_bytes(raw.cpu().numpy().tobytes())
            del cache[index:]
            cache.append(layout)
        elif index < len(cache):
            layout = cache[index]
        else:
            raise StreamError(f"bucket {index} reuses a layout this receiver never got (join again)")
        if layout.numel != numel:
            raise StreamError(f"bucket {index}: header says {numel} elements, layout says {layout.numel}")
        flat = torch.empty(numel, dtype=layout.dtype, device=group.device)
        group.broadcast(flat, what=f"bucket {index} ({layout.nbytes} bytes)")
        stats.bytes += layout.nbytes
        stats.tensors += len(layout.entries)
        expected += 1
        yield layout, flat
    stats.buckets = expected
    stats.seconds = time.perf_counter() - start


_Received = tuple[Layout, torch.Tensor] | BaseException | None
"""What the prefetch thread hands over: a bucket, the error that stopped it, or None at the end."""


def receive_update(
    group: Group, cache: list[Layout], stats: StreamStats, *, prefetch: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` as buckets arrive, until the end marker; fill ``stats``.

    Each bucket lands in a fresh buffer, so yielded tensors stay valid after the next bucket.
    With ``prefetch`` a background thread receives the next bucket while the consumer applies
    the current one (at most three buckets in memory).
    """
    if not prefetch:
        for layout, flat in _receive_buckets(group, cache, stats):
            yield from layout.views(flat)
        return
    slots: queue.Queue[_Received] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: _Received) -> None:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def run() -> None:
        try:
            for item in _receive_buckets(group, cache, stats):
                put(item)
            put(None)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=run, name="weightsync-receive", daemon=True)
    thread.start()
    try:
        while True:
            waited = time.perf_counter()
            try:
                item = slots.get(timeout=group.timeout_s + 5.0)
                stats.wait_seconds += time.perf_counter() - waited
            except queue.Empty:
                raise StreamError(f"no bucket arrived within {group.timeout_s:.0f}s") from None
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            layout, flat = item
            yield from layout.views(flat)
    finally:
        stop.set()
        thread.join(timeout=group.timeout_s + 5.0)
