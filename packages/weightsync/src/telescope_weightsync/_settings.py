"""Trainer-side settings of weight publishing (the CLI maps config fields onto these)."""

from __future__ import annotations

from dataclasses import dataclass

from telescope_weightsync._protocol import MODES
from telescope_weightsync._transport import BACKENDS


@dataclass(frozen=True)
class PublisherSettings:
    """How weights travel from the trainer's broadcast rank to the inference servers.

    - ``mode``: ``flattened_bucket`` packs tensors of one dtype into flat buffers of at most
      ``bucket_mb`` MiB (one broadcast per bucket); ``per_tensor`` broadcasts each tensor alone.
    - ``bucket_mb``: bucket size in MiB (> 0; the config uses whole MiB); a larger tensor travels alone.
    - ``cpu_staging``: copy each gathered tensor to host memory as it arrives (frees GPU memory
      early; needed when the transport is gloo and the trainer is on GPU).
    - ``pin_memory``: pin that host staging memory (only with CUDA).
    - ``backend``: ``auto`` (NCCL with CUDA, else gloo), ``gloo`` or ``nccl``.
    - ``init_timeout_s``: seconds allowed for every server to join a group.
    - ``timeout_s``: seconds allowed for one update (each broadcast and the servers' apply).
    """

    mode: str = "flattened_bucket"
    bucket_mb: float = 256
    cpu_staging: bool = False
    pin_memory: bool = True
    backend: str = "auto"
    init_timeout_s: float = 300.0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"PublisherSettings.mode must be one of {MODES}, got {self.mode!r}")
        if not float(self.bucket_mb) > 0:
            raise ValueError(f"PublisherSettings.bucket_mb must be > 0 MiB, got {self.bucket_mb}")
        if self.backend not in BACKENDS:
            raise ValueError(f"PublisherSettings.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("init_timeout_s", "timeout_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"PublisherSettings.{name} must be > 0 seconds, got {getattr(self, name)}")

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(float(self.bucket_mb) * 1024 * 1024))
