"""telescope-weightsync: live weight updates from a trainer into running vLLM servers.

Trainer side: ``WeightPublisher`` with ``PublisherSettings``. Inference side: the vLLM worker
extension ``telescope_weightsync.vllm_worker.WeightReceiver`` (import it only where vLLM is
installed; this package's top level never imports vLLM).
"""

from telescope_weightsync.__about__ import __version__
from telescope_weightsync._errors import WeightSyncError
from telescope_weightsync._protocol import plan_buckets
from telescope_weightsync._publisher import WeightPublisher
from telescope_weightsync._settings import PublisherSettings
from telescope_weightsync._version import BASE_VERSION, WeightVersion

__all__ = [
    "BASE_VERSION",
    "PublisherSettings",
    "WeightPublisher",
    "WeightSyncError",
    "WeightVersion",
    "__version__",
    "plan_buckets",
]
