"""Weight versions: -1 is the base model, every published update adds one."""

from __future__ import annotations

from dataclasses import dataclass

BASE_VERSION = -1


@dataclass(frozen=True, slots=True, order=True)
class WeightVersion:
    """The version of the weights a server serves; ``BASE_VERSION`` (-1) before any update."""

    value: int = BASE_VERSION

    def next(self) -> WeightVersion:
        """The version after one more published update."""
        return WeightVersion(self.value + 1)

    def steps_behind(self, newer: WeightVersion) -> int:
        """How many updates ``newer`` is ahead of this version (0 when not ahead)."""
        return max(0, newer.value - self.value)
