"""The update stream over a real gloo group: one sender and two receiver processes.

The receivers run ``receive_update`` exactly as the vLLM worker does (without vLLM) and print
what they got; the test compares it with what was sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

from telescope_weightsync import WeightSyncError, plan_buckets
from telescope_weightsync._stream import send_update
from telescope_weightsync._transport import make_group, open_store

RECEIVER = r"""
import json, sys
from telescope_weightsync._errors import WeightSyncError
from telescope_weightsync._stream import StreamStats, receive_update
from telescope_weightsync._transport import make_group, open_store
port, rank, world, updates = (int(a) for a in sys.argv[1:5])
store = open_store("127.0.0.1", port, is_master=False, timeout_s=30, prefix="telescope/t/")
group = make_group(store, rank=rank, world_size=world, backend="gloo", timeout_s=30, name="t",
                   iface_host="127.0.0.1")
cache = []
for _ in range(updates):
    stats = StreamStats()
    try:
        got = {n: t.tolist() for n, t in receive_update(group, cache, stats)}
        print(json.dumps({"tensors": got, "buckets": stats.buckets, "bytes": stats.bytes}), flush=True)
    except WeightSyncError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
group.close()
"""


def _weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(6, 4, generator=gen)),
        ("layer.0.norm", torch.randn(4, generator=gen).to(torch.bfloat16)),
        ("layer.0.proj", torch.randn(4, 4, generator=gen)),
        ("head.weight", torch.randn(5, 4, generator=gen)),
    ]


def _start(updates: int, receivers: int = 2):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=30, prefix="telescope/")
    tcp = store.underlying_store
    assert isinstance(tcp, TCPStore)
    port = tcp.port
    world = receivers + 1
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RECEIVER, str(port), str(rank), str(world), str(updates)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(1, world)
    ]
    own = open_store("127.0.0.1", port, is_master=False, timeout_s=30, prefix="telescope/t/")
    group = make_group(
        own, rank=0, world_size=world, backend="gloo", timeout_s=30, name="t", iface_host="127.0.0.1"
    )
    return store, group, procs


def _outputs(procs) -> list[list[dict]]:
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    return outs


@pytest.mark.slow
def test_two_receivers_get_exact_tensors_and_layouts_are_cached():
    _store, group, procs = _start(updates=2)
    cache: list = []
    try:
        # 48-byte buckets: embed (96 B) alone, norm (bf16) in its own dtype bucket, proj (64 B) alone,
        # head (80 B) alone -> 4 buckets.
        first = send_update(group, plan_buckets(_weights(1), mode="flattened_bucket", bucket_bytes=48), cache)
        second = send_update(
            group, plan_buckets(_weights(2), mode="flattened_bucket", bucket_bytes=48), cache
        )
    finally:
        group.close()
    outs = _outputs(procs)
    assert (first.buckets, first.layouts_sent, second.layouts_sent) == (4, 4, 0)
    assert first.bytes == 4 * (24 + 16 + 20) + 2 * 4
    for seed, index in ((1, 0), (2, 1)):
        want = {n: t.float().tolist() for n, t in _weights(seed)}
        for out in outs:
            assert out[index]["tensors"] == want
            assert out[index]["buckets"] == 4


@pytest.mark.slow
def test_failing_weight_iterator_aborts_receivers():
    _store, group, procs = _start(updates=1)

    def broken():
        yield from _weights(1)[:2]
        raise RuntimeError("gather failed")

    try:
        with pytest.raises(RuntimeError, match="gather failed"):
            send_update(group, plan_buckets(broken(), mode="per_tensor", bucket_bytes=1), [])
    finally:
        group.close()
    for out in _outputs(procs):
        assert "aborted the update after 2 buckets" in out[0]["error"]


@pytest.mark.slow
def test_dead_receiver_makes_the_sender_fail_within_its_timeout():
    _store, group, procs = _start(updates=1, receivers=1)
    procs[0].kill()
    procs[0].communicate(timeout=30)
    group.timeout_s = 5.0
    start = time.monotonic()
    big = [("w", torch.zeros(4 * 1024 * 1024))]  # 16 MB: more than the socket buffers hold
    try:
        with pytest.raises(WeightSyncError, match="group 't' rank 0/2"):
            send_update(group, plan_buckets(big, mode="per_tensor", bucket_bytes=1), [])
    finally:
        group.close()
    assert time.monotonic() - start < 5.0 + 10


@pytest.mark.parametrize(
    "src",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous: torch copy
        torch.arange(6, dtype=torch.float32).to(torch.bfloat16).reshape(2, 3),  # no numpy bf16
        torch.nn.Parameter(torch.ones(2, 2) * 3),  # requires grad
        torch.empty(0, 4),
    ],
)
def test_copy_flat_writes_the_tensor_in_row_major_order(src):
    from telescope_weightsync._stream import copy_flat

    dst = torch.full((src.numel() + 2,), -1.0, dtype=src.dtype)
    copy_flat(dst[1 : 1 + src.numel()], src)
    want = [-1.0, *src.detach().contiguous().reshape(-1).float().tolist(), -1.0]
    assert dst.float().tolist() == want
