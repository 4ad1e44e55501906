"""A circuit breaker for a sandbox provider that stays down, and the backoff between retries.

Infrastructure failures (``SandboxInfraError``: the sandbox failed, not the program) are retried
by ``SandboxPool`` after :func:`backoff_s`. Once ``threshold`` runs in a row have failed that way
the breaker opens: for ``cooldown_s`` every run fails at once with ``SandboxProviderDownError``
instead of waiting on a provider that is down (a batch of rollouts never hangs on it). After the
cooldown one run goes through as a probe: success closes the breaker, another failure opens it
again for a further ``cooldown_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Breaker", "backoff_s"]


def backoff_s(attempt: int, base_s: float, cap_s: float = 10.0) -> float:
    """The pause before retry ``attempt`` (1, 2, ...): ``base_s``, doubling, at most ``cap_s``."""
    return min(cap_s, base_s * 2 ** (attempt - 1)) if base_s > 0 else 0.0


@dataclass
class Breaker:
    """Counts infrastructure failures in a row; open means: fail runs at once (see the module)."""

    threshold: int
    cooldown_s: float
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    """Runs in a row that failed with an infrastructure error."""
    opened_at: float | None = None
    last_error: str = ""
    opened: int = 0
    """How many times it opened."""
    _probing: bool = field(default=False, repr=False)

    def check(self) -> float | None:
        """None when a run may go (closed, or the probe after a cooldown); else the seconds left."""
        if self.opened_at is None:
            return None
        left = self.opened_at + self.cooldown_s - self.clock()
        if left > 0 or self._probing:
            return max(left, 0.0)
        self._probing = True  # one run tries the provider again
        return None

    def succeeded(self) -> None:
        self.failures, self.opened_at, self._probing = 0, None, False

    def failed(self, error: str) -> None:
        """A run gave up on an infrastructure error (after its retries)."""
        self.failures += 1
        self.last_error = error
        if self._probing or (self.opened_at is None and self.failures >= self.threshold):
            self.opened_at, self._probing = self.clock(), False
            self.opened += 1
