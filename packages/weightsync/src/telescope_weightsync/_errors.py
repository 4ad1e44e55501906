"""The errors weight sync raises: one base class to catch them all, a subclass per kind of failure.

Each is raised where its condition is detected (the HTTP call, a collective, the stream reader),
so callers decide by type, never by message. Every message names the peer (server URL or group
rank) that did not answer and the step that failed, so a stuck or dead inference server is found
without reading logs.

```
WeightSyncError
├── ServerError          a server failed a call, answered wrongly or not at all (.server)
│   ├── ServerTimeout        it did not answer within the timeout
│   └── ReceiverMissing      it has no /collective_rpc: not started for weight sync
├── GroupError           a broadcast group is not connected, could not form, or failed a collective
├── StreamError          an update's stream broke the protocol, or the publisher aborted it
└── UpdateError          an update did not complete on its group (and no server owned up to it)
```
"""

from __future__ import annotations

__all__ = [
    "GroupError",
    "ReceiverMissing",
    "ServerError",
    "ServerTimeout",
    "StreamError",
    "UpdateError",
    "WeightSyncError",
]


class WeightSyncError(RuntimeError):
    """A weight update, a group join or a version query failed or timed out."""


class ServerError(WeightSyncError):
    """The inference server at ``server`` (its URL) failed a call or answered something unusable."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server

    def __reduce__(self) -> tuple[type[ServerError], tuple[str, str]]:
        # pickled across Ray (a trainer actor's publish): rebuild with both arguments
        return (type(self), (self.server, str(self)))


class ServerTimeout(ServerError):
    """The server did not answer a call within its timeout."""


class ReceiverMissing(ServerError):
    """The server has no ``/collective_rpc`` route: vLLM runs without dev mode or the receiver."""


class GroupError(WeightSyncError):
    """A broadcast group is not connected, could not form, or one of its collectives failed."""


class StreamError(WeightSyncError):
    """A receiver got a stream that breaks the update protocol, or the publisher's abort marker."""


class UpdateError(WeightSyncError):
    """An update did not complete on its group; the message says what the trainer side saw."""
