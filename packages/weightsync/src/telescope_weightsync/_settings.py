"""Trainer-side settings of weight publishing, and how a run's config maps onto them.

``PublisherSettings.from_config`` reads the run config's weight-broadcast fields by name
(``CONFIG_FIELDS``); this package does not import ``telescope_config``, so the config is typed by
the ``PublisherConfig`` protocol, which ``telescope_config.TelescopeConfig`` satisfies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol

from telescope_weightsync._protocol import MODES
from telescope_weightsync._transport import BACKENDS, resolve_backend

__all__ = ["CONFIG_FIELDS", "DEFAULT_BUCKET_MB", "PublisherConfig", "PublisherSettings"]

DEFAULT_BUCKET_MB = {"nccl": 256.0, "gloo": 32.0}
"""``bucket_mb=None`` picks these per transport. 256 MiB on NCCL is the config's packaged default;
on gloo (CPU) 32 MiB updated SmolLM2-135M fastest on the 2-core CI machine (0.94 s against 1.22 s
with 256 MiB and 1.84 s per tensor): smaller buckets let the server apply one bucket while the
next arrives, and a full model never sits in one buffer."""

CONFIG_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "mode": "weight_broadcast_mode",
        "bucket_mb": "weight_broadcast_bucket_mb",
        "cpu_staging": "weight_broadcast_cpu_staging",
        "pin_memory": "weight_broadcast_pin_memory",
        "init_timeout_s": "ray_broadcast_init_timeout_s",
        "timeout_s": "weight_broadcast_timeout_s",
    }
)
"""The run-config field each setting comes from. ``backend`` has none: a run uses ``auto``."""


class PublisherConfig(Protocol):
    """The run-config fields weight publishing reads (see ``CONFIG_FIELDS``)."""

    @property
    def weight_broadcast_mode(self) -> str: ...
    @property
    def weight_broadcast_bucket_mb(self) -> float: ...
    @property
    def weight_broadcast_cpu_staging(self) -> bool: ...
    @property
    def weight_broadcast_pin_memory(self) -> bool: ...
    @property
    def ray_broadcast_init_timeout_s(self) -> float: ...
    @property
    def weight_broadcast_timeout_s(self) -> float: ...


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

    CONFIG_FIELDS: ClassVar[Mapping[str, str]] = CONFIG_FIELDS
    """Each setting's run-config field (``from_config``; ``backend`` has none)."""
    DEFAULT_BUCKET_MB: ClassVar[Mapping[str, float]] = MappingProxyType(DEFAULT_BUCKET_MB)
    """``bucket_mb`` when it is None, per transport."""

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
        for name, value in (("init_timeout_s", self.init_timeout_s), ("timeout_s", self.timeout_s)):
            if not float(value) > 0:
                raise ValueError(f"PublisherSettings.{name} must be > 0 seconds, got {value}")

    @classmethod
    def from_config(cls, config: PublisherConfig, *, user_keys: Collection[str]) -> PublisherSettings:
        """The settings of a run whose resolved config is ``config``.

        ``user_keys`` are the fields the run itself set (``ResolvedConfig.user_keys``): the bucket
        size is the config's only when the run set ``weight_broadcast_bucket_mb``; otherwise it
        is left to the transport (``bucket_mb=None``, see ``DEFAULT_BUCKET_MB``).
        """
        bucket_set = CONFIG_FIELDS["bucket_mb"] in user_keys
        return cls(
            mode=config.weight_broadcast_mode,
            bucket_mb=config.weight_broadcast_bucket_mb if bucket_set else None,
            cpu_staging=config.weight_broadcast_cpu_staging,
            pin_memory=config.weight_broadcast_pin_memory,
            init_timeout_s=float(config.ray_broadcast_init_timeout_s),
            timeout_s=float(config.weight_broadcast_timeout_s),
        )

    @property
    def bucket_bytes(self) -> int:
        """Bucket size in bytes (``bucket_mb``, or the default of the transport ``backend`` resolves to)."""
        mib = self.bucket_mb
        if mib is None:
            mib = DEFAULT_BUCKET_MB[resolve_backend(self.backend)]
        return max(1, int(float(mib) * 1024 * 1024))
