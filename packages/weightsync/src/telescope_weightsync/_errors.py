"""The one error type weight sync raises, so callers can catch every failure in one place."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight update, a group join or a version query failed or timed out.

    The message names the peer (server URL or group rank) that did not answer and the step
    that failed, so a stuck or dead inference server is identified without reading logs.
    """
