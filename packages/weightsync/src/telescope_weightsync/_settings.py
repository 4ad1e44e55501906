"""Trainer-side settings of weight publishing (the CLI maps config fields onto these)."""

from __future__ import annotations

from dataclasses import dataclass

from telescope_weightsync._protocol import MODES
from telescope_weightsync._transport import BACKENDS, resolve_backend

DEFAULT_BUCKET_MB = {"nccl": 256.0, "gloo": 32.0}
"""``bucket_mb=None`` picks these per transport. 256 MiB is the original's GPU default; on gloo
(CPU) 32 MiB updated SmolLM2-135M fastest on the 2-core CI machine (0.94 s against 1.22 s with
256 MiB and 1.84 s per tensor): smaller buckets let the server apply one bucket while the next
arrives, and a full model never sits in one buffer."""


@dataclass(frozen=True)
class PublisherSettings:
    """How weights travel from the trainer's broadcast rank to the inference servers.

    - ``mode``: ``flattened_bucket`` packs tensors of one dtype into flat buffers of at most
      ``bucket_mb`` MiB (one broadcast per bucket); ``per_tensor`` broadcasts each tensor alone.
    - ``bucket_mb``: bucket size in MiB (> 0; the config uses whole MiB); a larger tensor travels
      alone. ``None``: per transport, ``DEFAULT_BUCKET_MB`` (256 with NCCL, 32 with gloo).
    - ``cpu_staging``: copy each gathered tensor to host memory as it arrives (frees GPU memory
      early; needed when the transport is gloo and the trainer is on GPU).
    - ``pin_memory``: pin that host staging memory (only with CUDA).
    - ``backend``: ``auto`` (NCCL with CUDA, else gloo), ``gloo`` or ``nccl``.
    - ``init_timeout_s``: seconds allowed for every server to join a group.
    - ``timeout_s``: seconds allowed for one update (each broadcast and the servers' apply).
    """

    mode: str = "flattened_bucket"
    bucket_mb: float | None = None
    cpu_staging: bool = False
    pin_memory: bool = True
    backend: str = "auto"
    init_timeout_s: float = 300.0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"PublisherSettings.mode must be one of {MODES}, got {self.mode!r}")
        if self.bucket_mb is not None and not float(self.bucket_mb) > 0:
            raise ValueError(f"PublisherSettings.bucket_mb must be > 0 MiB, got {self.bucket_mb}")
        if self.backend not in BACKENDS:
            raise ValueError(f"PublisherSettings.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("init_timeout_s", "timeout_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"PublisherSettings.{name} must be > 0 seconds, got {getattr(self, name)}")

    @property
    def bucket_bytes(self) -> int:
        """Bucket size in bytes (``bucket_mb``, or the default of the transport ``backend`` resolves to)."""
        mib = self.bucket_mb
        if mib is None:
            mib = DEFAULT_BUCKET_MB[resolve_backend(self.backend)]
        return max(1, int(float(mib) * 1024 * 1024))
