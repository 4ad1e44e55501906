"""telescope-weightsync: live weight updates from a trainer into running vLLM servers.

The publisher, the vLLM receiver and the transports arrive with their issue; this release holds
the weight-version bookkeeping both sides share.
"""

from telescope_weightsync.__about__ import __version__
from telescope_weightsync._version import WeightVersion

__all__ = ["WeightVersion", "__version__"]
