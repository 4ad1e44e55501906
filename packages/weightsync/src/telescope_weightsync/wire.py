"""The wire under ``WeightPublisher``: a transport group and the stream of one update, for a
receiver of your own (an inference engine other than vLLM, a test process) and for benchmarks.

- transport: ``open_store`` (the TCP store a group meets at), ``make_group`` (one group on it:
  ``Group.broadcast`` over NCCL or gloo), ``resolve_backend`` (``auto`` → ``nccl`` with CUDA,
  else ``gloo``);
- stream: ``send_update`` (the sender's side of one update, in buckets planned by
  ``plan_buckets``), ``receive_update`` (yields each ``(name, tensor)`` as it arrives),
  ``Scratch`` (the sender's reusable buffers), ``StreamStats`` (bytes, buckets and times).

docs/weightsync.md describes the protocol; the vLLM side is ``telescope_weightsync.vllm_worker``.
"""

from telescope_weightsync._stream import Scratch, StreamStats, receive_update, send_update
from telescope_weightsync._transport import Group, make_group, open_store, resolve_backend

# transport
__all__ = ["Group", "make_group", "open_store", "resolve_backend"]
# stream
__all__ += ["Scratch", "StreamStats", "receive_update", "send_update"]
