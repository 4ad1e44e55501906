"""telescope-weightsync: live weight updates from a trainer into running vLLM servers.

Trainer side: ``WeightPublisher`` with ``PublisherSettings`` (``PublisherSettings.from_config``
maps a run's config onto them); it sends the whole model, or a LoRA adapter alone
(``write_adapter`` is the adapter's folder format); ``load_folder`` serves a model folder in
place of a running server's weights. Inference side: the vLLM worker extension
``telescope_weightsync.vllm_worker.WeightReceiver`` (import it only where vLLM is installed; this
package's top level never imports vLLM). docs/weightsync.md describes the protocol.
"""

from telescope_weightsync.__about__ import __version__
from telescope_weightsync._adapter import ADAPTER_NAME, write_adapter
from telescope_weightsync._errors import (
    GroupError,
    ReceiverMissing,
    ServerError,
    ServerTimeout,
    StreamError,
    UpdateError,
    WeightSyncError,
)
from telescope_weightsync._http import load_folder, probe_version, server_version
from telescope_weightsync._protocol import plan_buckets
from telescope_weightsync._publisher import PublishSpan, ServerUpdate, WeightPublisher
from telescope_weightsync._settings import PublisherConfig, PublisherSettings
from telescope_weightsync._version import BASE_VERSION, WeightVersion

__all__ = [
    # Publishing (trainer side)
    "PublisherConfig",
    "PublisherSettings",
    "PublishSpan",
    "ServerUpdate",
    "WeightPublisher",
    "plan_buckets",
    # LoRA adapters (PEFT's folder format; the name servers serve one under)
    "ADAPTER_NAME",
    "write_adapter",
    # A Hugging Face folder served in place of a server's weights (``telescope eval``)
    "load_folder",
    # Versions
    "BASE_VERSION",
    "WeightVersion",
    "probe_version",
    "server_version",
    # Errors: the base class, and a server's failures (``.server`` is its URL)
    "WeightSyncError",
    "ReceiverMissing",
    "ServerError",
    "ServerTimeout",
    # Errors of a group, of an update's stream, of an update as a whole
    "GroupError",
    "StreamError",
    "UpdateError",
    # Package
    "__version__",
]
