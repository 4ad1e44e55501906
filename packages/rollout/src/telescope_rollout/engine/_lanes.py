"""Lane slots of one inference server: one slot is one in-flight request (docs/rollout.md, "Lanes").

Slots are numbered ``0..capacity-1`` and always taken smallest-first, so lane numbers are
deterministic (the UI draws its timeline by them). Waiters are served first-come first-served;
a waiter cancelled after being handed a slot gives it back, so no slot is ever lost.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque


class LanePool:
    """``capacity`` numbered slots with FIFO async waiting."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a server needs at least one lane slot, got capacity {capacity}")
        self.capacity = capacity
        self._free = list(range(capacity))
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def free(self) -> int:
        """Slots not held by anyone (waiters not subtracted)."""
        return len(self._free)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    @property
    def unclaimed(self) -> int:
        """Free slots no waiter is going to take: room for new work."""
        return len(self._free) - self.waiting

    @property
    def busy(self) -> int:
        return self.capacity - len(self._free)

    def try_acquire(self, n: int = 1) -> list[int] | None:
        """``n`` slots at once if they are free and nobody waits, else None."""
        if self.waiting or len(self._free) < n:
            return None
        return [heapq.heappop(self._free) for _ in range(n)]

    async def acquire(self) -> int:
        """One slot, waiting in line when none is free."""
        if self._free and not self.waiting:
            return heapq.heappop(self._free)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise

    def release(self, lane: int) -> None:
        """Give a slot back: to the first live waiter, else to the free heap."""
        if not 0 <= lane < self.capacity:
            raise ValueError(f"lane {lane} is not in 0..{self.capacity - 1}")
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(lane)
                return
        heapq.heappush(self._free, lane)
