"""Step metrics reduced over micro-batches and ranks, identical on every rank.

``compute_loss`` returns token-weighted means per micro-batch; here they become token-weighted means
over the whole step: ``Σ value·weight / Σ weight`` with the sums taken over every micro-batch of
every rank in one all-reduce. The weight is the micro-batch's loss-token count after sequence IS
masking (``metrics["num_tokens"]``), except ``seq_is_masked_frac`` whose weight is the count before
masking. Plain sums (``loss`` per minibatch group) and per-rank averages (timings) ride in the same
all-reduce.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

import torch
import torch.distributed as dist

from telescope_trainer_fsdp._distributed import collectives

__all__ = ["StepMetrics"]

_NOT_MEANS = {"loss", "num_tokens"}


class StepMetrics:
    """Accumulates one step's metrics on this rank; :meth:`reduce` combines all ranks."""

    def __init__(self) -> None:
        self._weighted: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)
        self._sums: dict[str, float] = defaultdict(float)
        self._rank_means: dict[str, float] = {}

    def add_micro_batch(self, metrics: dict[str, torch.Tensor], *, input_tokens: int) -> None:
        """Add one micro-batch's ``compute_loss`` metrics; ``input_tokens``: loss tokens before masking."""
        kept = float(metrics["num_tokens"])
        for name, value in metrics.items():
            if name in _NOT_MEANS:
                continue
            weight = float(input_tokens) if name == "seq_is_masked_frac" else kept
            self._weighted[name] += float(value) * weight
            self._weights[name] += weight

    def add_sum(self, name: str, value: float) -> None:
        """A quantity summed over micro-batches and ranks (e.g. a group's loss share)."""
        self._sums[name] += float(value)

    def set_rank_mean(self, name: str, value: float) -> None:
        """A per-rank quantity averaged over ranks (e.g. a timing)."""
        self._rank_means[name] = float(value)

    def reduce(self, *, device: torch.device, copies: int = 1) -> dict[str, float]:
        """All-reduce (collective; every rank must have added the same names) and return the step's values.

        ``copies``: how many ranks computed each micro-batch (context parallelism); sums count it once.
        Means need no correction: every copy adds the same value and the same weight.
        """
        means = sorted(self._weights)
        sums = sorted(self._sums)
        ranks = sorted(self._rank_means)
        values = (
            [self._weighted[n] for n in means]
            + [self._weights[n] for n in means]
            + [self._sums[n] for n in sums]
            + [self._rank_means[n] for n in ranks]
        )
        t = torch.tensor(values, dtype=torch.float64, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            collectives.all_reduce(t)
        world = dist.get_world_size() if dist.is_initialized() else 1
        flat: list[float] = cast(Any, t.cpu()).tolist()  # torch annotates tolist() as a bare list
        k = len(means)
        out = {n: flat[i] / flat[k + i] if flat[k + i] > 0 else 0.0 for i, n in enumerate(means)}
        out.update(zip(sums, (v / copies for v in flat[2 * k : 2 * k + len(sums)]), strict=True))
        out.update({n: v / world for n, v in zip(ranks, flat[2 * k + len(sums) :], strict=True)})
        return out
