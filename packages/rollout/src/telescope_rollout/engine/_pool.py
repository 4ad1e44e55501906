"""The engine's inference servers: which are in the training pool, the weight version each
holds, their lane slots, and the round-robin choice of the next one (docs/rollout.md, "Lanes").

A server is out of the pool while it is ``down`` (a request found it unreachable), ``drained``
(taken for evals: ``RolloutEngine.drain_servers``) or ``lost`` (dead, being restarted by the
caller: ``RolloutEngine.server_lost``). The pool only keeps this state and checks what the
engine is told against it; which groups that cancels is the engine's business.
"""

from __future__ import annotations

from collections.abc import Sequence

from telescope_rollout.engine._lanes import LanePool

__all__ = ["ServerPool"]


class ServerPool:
    """The servers of one engine (module docstring); URLs without a trailing slash."""

    def __init__(self, urls: Sequence[str], lanes_per_server: int) -> None:
        self.servers = list(urls)
        self.lanes = {url: LanePool(lanes_per_server) for url in self.servers}
        self.versions = dict.fromkeys(self.servers, 0)
        """Weight version each server holds."""
        self.down: dict[str, str] = {}
        """Servers a request found unreachable, with the error."""
        self.drained: set[str] = set()
        """Servers out of the training pool for evals."""
        self.lost: set[str] = set()
        """Dead servers the caller restarts."""
        self._next = 0

    def known(self, servers: Sequence[str]) -> set[str]:
        """``servers`` as this pool's URLs; an unknown one (or one string) is an error."""
        if isinstance(servers, str):
            raise TypeError("pass a list of server URLs, not one string")
        urls = {u.rstrip("/") for u in servers}
        unknown = sorted(urls - set(self.servers))
        if unknown:
            raise ValueError(f"unknown servers {unknown}; the engine's servers are {self.servers}")
        return urls

    def usable(self, url: str) -> bool:
        """In the pool and reachable: new work may go to it."""
        return url not in self.down and url not in self.drained and url not in self.lost

    @property
    def all_down(self) -> bool:
        """Every server was found unreachable."""
        return len(self.down) == len(self.servers)

    def pick(self, group_size: int, *, per_sample: bool) -> tuple[str, list[int] | None] | None:
        """The next usable server with room, round robin: with ``per_sample`` lanes one free slot
        (its samples take slots as they start), else ``group_size`` slots taken now for the whole
        group. None when no server has room."""
        n = len(self.servers)
        for k in range(n):
            url = self.servers[(self._next + k) % n]
            if not self.usable(url):
                continue
            pool = self.lanes[url]
            lanes = None if per_sample else pool.try_acquire(group_size)
            if (per_sample and pool.unclaimed >= 1) or lanes is not None:
                self._next = (self._next + k + 1) % n
                return url, lanes
        return None

    def update(self, version: int, servers: Sequence[str] | None) -> dict[str, int]:
        """Weight ``version`` went to ``servers`` (None: all); returns how many versions each
        server moved. Every server in the pool must be among them (drained and lost ones may not)."""
        targets = set(self.servers) if servers is None else self.known(servers)
        out = self.drained | self.lost
        missed = sorted(u for u in self.servers if u not in out and u not in targets)
        if missed:
            raise ValueError(
                f"servers {missed} are in the training pool but did not get weight version {version}: "
                "send the weights to every server in the pool, or drain_servers() them first"
            )
        moved = {url: version - self.versions[url] for url in targets}
        for url in targets:
            self.versions[url] = version
        return moved

    def behind(self, urls: set[str], version: int) -> dict[str, int]:
        """Of ``urls`` (lost ones aside: they come back through a restart), those that do not
        hold ``version``, with the version they hold."""
        return {u: self.versions[u] for u in sorted(urls - self.lost) if self.versions[u] != version}

    def back(self, url: str, version: int) -> None:
        """A restarted server holds ``version`` and serves again."""
        self.versions[url] = version
        self.lost.discard(url)
        self.down.pop(url, None)

    def reset_versions(self, version: int) -> None:
        """Every server holds ``version`` (a resumed engine: its servers got the checkpoint's weights)."""
        self.versions = dict.fromkeys(self.servers, version)
