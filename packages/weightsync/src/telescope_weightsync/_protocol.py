"""The wire format of one weight update, shared by the publisher and the vLLM receiver.

An update is a stream of *buckets* broadcast from group rank 0. Each bucket holds tensors of one
dtype laid out back to back in one flat buffer (``flattened_bucket`` mode) or exactly one tensor
(``per_tensor`` mode). Before each bucket, rank 0 broadcasts a header of four int64 values:

``[op, index, meta_len, numel]``

- ``op == OP_BUCKET``: bucket number ``index`` follows. When ``meta_len > 0`` a uint8 tensor of
  ``meta_len`` bytes (the JSON layout: dtype, numel, ``[name, shape, offset]`` entries) comes
  first; when ``meta_len == 0`` the receiver reuses the layout it cached for ``index`` during an
  earlier update. Then the data: ``numel`` elements of the bucket's dtype.
- ``op == OP_END``: the update is complete; ``index`` is the number of buckets sent.
- ``op == OP_ABORT``: the publisher gave up (its weight iterator raised); receivers stop and
  report an error instead of waiting for data that never comes.

Only torch is needed here: both sides import this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

OP_BUCKET = 1
OP_END = 2
OP_ABORT = 3
HEADER_LEN = 4

MODES = ("flattened_bucket", "per_tensor")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the name used on the wire)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`; raises ``ValueError`` for an unknown name."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight-update layout")
    return dtype


@dataclass(frozen=True)
class Entry:
    """One tensor inside a bucket: its Hugging Face name, shape and element offset."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """Where each tensor of one bucket lives in the bucket's flat buffer."""

    dtype: torch.dtype
    numel: int
    entries: tuple[Entry, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def to_bytes(self) -> bytes:
        entries = [[e.name, list(e.shape), e.offset] for e in self.entries]
        return json.dumps({"dtype": dtype_name(self.dtype), "numel": self.numel, "entries": entries}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Layout:
        data = json.loads(raw.decode())
        entries = tuple(Entry(name, tuple(shape), offset) for name, shape, offset in data["entries"])
        return cls(dtype=dtype_from_name(data["dtype"]), numel=int(data["numel"]), entries=entries)

    def views(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` views into a received flat buffer (no copy)."""
        for e in self.entries:
            yield e.name, flat[e.offset : e.offset + e.numel].view(e.shape)


@dataclass
class Bucket:
    """A bucket being sent: its layout and the source tensors in layout order."""

    layout: Layout
    tensors: list[torch.Tensor] = field(repr=False)


class _OpenBucket:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.entries: list[Entry] = []
        self.tensors: list[torch.Tensor] = []
        self.numel = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.entries.append(Entry(name, tuple(tensor.shape), self.numel))
        self.tensors.append(tensor)
        self.numel += tensor.numel()

    def close(self) -> Bucket:
        return Bucket(Layout(self.dtype, self.numel, tuple(self.entries)), self.tensors)


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], *, mode: str, bucket_bytes: int
) -> Iterator[Bucket]:
    """Group a stream of named tensors into buckets, lazily (the whole model is never held).

    ``per_tensor``: one bucket per tensor, in input order. ``flattened_bucket``: one open bucket
    per dtype; a tensor that would push its bucket past ``bucket_bytes`` closes that bucket
    first; a tensor bigger than ``bucket_bytes`` travels alone. Open buckets are flushed at the
    end in the order they were opened.
    """
    if mode not in MODES:
        raise ValueError(f"weight broadcast mode must be one of {MODES}, got {mode!r}")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    open_buckets: dict[torch.dtype, _OpenBucket] = {}
    for name, tensor in named_tensors:
        # A trainer's weight iterator is not type-checked against this signature: say what it gave.
        if not isinstance(tensor, torch.Tensor):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
        if mode == "per_tensor":
            single = _OpenBucket(tensor.dtype)
            single.add(name, tensor)
            yield single.close()
            continue
        current = open_buckets.get(tensor.dtype)
        if (
            current is not None
            and current.numel
            and (current.numel + tensor.numel()) * tensor.element_size() > bucket_bytes
        ):
            yield open_buckets.pop(tensor.dtype).close()
            current = None
        if current is None:
            current = open_buckets[tensor.dtype] = _OpenBucket(tensor.dtype)
        current.add(name, tensor)
    for bucket in open_buckets.values():
        yield bucket.close()


def header(op: int, index: int = 0, meta_len: int = 0, numel: int = 0) -> torch.Tensor:
    """The int64 header tensor that precedes a bucket (see the module docstring)."""
    return torch.tensor([op, index, meta_len, numel], dtype=torch.int64)
