"""Seeded, checkpointable sampling over several environments.

Each draw picks an environment with probability ``weight / Σ weights`` and then a uniform index
among that environment's training indices (with replacement, forever). Draw ``n`` depends only on
``(seed, n)``, so the whole state is ``{"seed", "draws"}``: a resumed run continues the same
sequence exactly.

Held-out eval indices are excluded per environment. An exclusion may be keyed by the config
entry's name or by ``env.name``; both resolve to the entry, so a renamed environment still keeps
its eval samples out of training.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from telescope_rollout._types import Sample


@dataclass
class SamplerEntry:
    """One environment as the sampler sees it: its config name, weight and dataset size."""

    name: str
    weight: float
    size: int
    env_name: str | None = None
    """``env.name`` when it differs from the config name."""


@dataclass
class Draw:
    entry: str
    index: int


class MultiEnvSampler:
    """Infinite weighted draws of (environment, sample index); see the module docstring."""

    def __init__(
        self,
        entries: Sequence[SamplerEntry],
        *,
        seed: int = 0,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ):
        if not entries:
            raise ValueError("the sampler needs at least one environment")
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate environment names {names}: give each entry a distinct name")
        for e in entries:
            if not e.weight > 0:
                raise ValueError(f"environment {e.name!r} has weight {e.weight}; weights must be > 0")
        self.entries = list(entries)
        self.seed = int(seed)
        self.draws = 0
        alias = {e.name: e.name for e in entries}
        alias.update({e.env_name: e.name for e in entries if e.env_name})
        excluded: dict[str, set[int]] = {e.name: set() for e in entries}
        for key, idxs in (exclude or {}).items():
            if key not in alias:
                raise KeyError(f"exclusion for unknown environment {key!r}; known: {sorted(alias)}")
            excluded[alias[key]].update(int(i) for i in idxs)
        self._candidates: dict[str, list[int] | range] = {}
        for e in entries:
            ex = excluded[e.name]
            cands = range(e.size) if not ex else [i for i in range(e.size) if i not in ex]
            if len(cands) == 0:
                raise ValueError(
                    f"environment {e.name!r} has no training samples left after excluding eval samples"
                )
            self._candidates[e.name] = cands
        total = sum(e.weight for e in entries)
        self._cum = list(accumulate(e.weight / total for e in entries))

    def candidates(self, name: str) -> Sequence[int]:
        """The training indices of an entry (eval indices removed)."""
        return self._candidates[name]

    def draw(self) -> Draw:
        rng = random.Random(f"{self.seed}:{self.draws}")
        self.draws += 1
        k = min(bisect.bisect_right(self._cum, rng.random()), len(self.entries) - 1)
        entry = self.entries[k]
        cands = self._candidates[entry.name]
        return Draw(entry.name, cands[rng.randrange(len(cands))])

    def __iter__(self):
        return self

    def __next__(self) -> Draw:
        return self.draw()

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able checkpoint of the sequence position."""
        return {"seed": self.seed, "draws": self.draws, "entries": [e.name for e in self.entries]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        names = [e.name for e in self.entries]
        if list(state.get("entries", names)) != names:
            raise ValueError(f"checkpoint was taken with environments {state.get('entries')}, now {names}")
        self.seed = int(state["seed"])
        self.draws = int(state["draws"])


def sample_from(envs: Mapping[str, Any], draw: Draw) -> Sample:
    """The drawn sample, tagged with ``metadata["_env_name"]`` (the config entry name)."""
    s = envs[draw.entry].get_sample(draw.index)
    return Sample(s.prompt, s.answer, {**s.metadata, "_env_name": draw.entry, "_index": draw.index})
