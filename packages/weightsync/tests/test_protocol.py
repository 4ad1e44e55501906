"""Bucket planning and the wire format, by hand-worked examples (no network)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from telescope_weightsync import PublisherSettings, plan_buckets
from telescope_weightsync._protocol import Entry, Layout, dtype_from_name


def _named(*specs):
    """specs: (name, numel, dtype) -> named tensors filled with their index."""
    return [(n, torch.full((k,), float(i), dtype=d)) for i, (n, k, d) in enumerate(specs)]


def test_flattened_buckets_split_by_dtype_and_size():
    f32, bf16 = torch.float32, torch.bfloat16
    # bucket_bytes = 40: a (4 el * 4 B = 16 B) + b (16 B) = 32 B fit; c (3 el = 12 B) would make 44 B > 40,
    # so [a, b] closes when c arrives. bf16 tensors x (10 el * 2 B = 20 B) and y (10 el = 20 B) fill 40 B
    # exactly (not more), so they share a bucket. d (20 el = 80 B) is bigger than a bucket: it closes [c]
    # and travels alone. Open buckets flush at the end in the order they were opened: bf16 [x, y], then
    # f32 [d].
    named = _named(
        ("a", 4, f32), ("b", 4, f32), ("x", 10, bf16), ("c", 3, f32), ("y", 10, bf16), ("d", 20, f32)
    )
    buckets = list(plan_buckets(named, mode="flattened_bucket", bucket_bytes=40))
    got = [(b.layout.dtype, [(e.name, e.offset) for e in b.layout.entries], b.layout.numel) for b in buckets]
    assert got == [
        (f32, [("a", 0), ("b", 4)], 8),
        (f32, [("c", 0)], 3),
        (bf16, [("x", 0), ("y", 10)], 20),
        (f32, [("d", 0)], 20),
    ]


def test_per_tensor_mode_keeps_input_order():
    named = _named(("a", 4, torch.float32), ("x", 2, torch.bfloat16), ("b", 1, torch.float32))
    buckets = list(plan_buckets(named, mode="per_tensor", bucket_bytes=1))
    assert [[e.name for e in b.layout.entries] for b in buckets] == [["a"], ["x"], ["b"]]
    assert [b.layout.nbytes for b in buckets] == [16, 4, 4]


def test_planning_is_lazy():
    consumed = []

    def source():
        for i in range(4):
            consumed.append(i)
            yield f"t{i}", torch.zeros(2)

    # 8-byte tensors in 16-byte buckets: the first bucket is complete when the third tensor arrives.
    first = next(plan_buckets(source(), mode="flattened_bucket", bucket_bytes=16))
    assert [e.name for e in first.layout.entries] == ["t0", "t1"]
    assert consumed == [0, 1, 2]


def test_layout_round_trip_and_views():
    layout = Layout(torch.bfloat16, 10, (Entry("w", (2, 3), 0), Entry("b", (4,), 6)))
    again = Layout.from_bytes(layout.to_bytes())
    assert again == layout
    assert again.nbytes == 20
    flat = torch.arange(10, dtype=torch.bfloat16)
    views = dict(again.views(flat))
    assert views["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert views["b"].tolist() == [6, 7, 8, 9]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "bucketed"}, "mode must be one of"),
        ({"bucket_mb": 0}, "bucket_mb must be > 0"),
        ({"backend": "mpi"}, "backend must be one of"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
    ],
)
def test_settings_reject_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PublisherSettings(**kwargs)


def test_bad_input_is_explained():
    with pytest.raises(TypeError, match="'w' is a list"):
        list(plan_buckets(cast(Any, [("w", [1.0])]), mode="per_tensor", bucket_bytes=1))
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_from_name("float7")
    assert PublisherSettings(bucket_mb=2).bucket_bytes == 2 * 1024 * 1024
    assert PublisherSettings(bucket_mb=256, backend="gloo").bucket_bytes == 256 * 1024 * 1024


def test_default_bucket_size_depends_on_the_transport():
    # None: 32 MiB on gloo (the faster size on CPU), 256 MiB on NCCL (the config's packaged default)
    assert PublisherSettings(backend="gloo").bucket_bytes == 32 * 1024 * 1024
    if not torch.cuda.is_available():
        assert PublisherSettings().bucket_bytes == 32 * 1024 * 1024  # auto -> gloo without CUDA
