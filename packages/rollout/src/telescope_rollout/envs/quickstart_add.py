"""quickstart_add: "What is a + b? Reply with just the number." (the CPU quickstart task).

Procedurally generated and offline. Reward 1.0 for the bare right number, 0.5 when the last
number in the reply is right, 0 otherwise. SmolLM2-135M starts near 0.1-0.2 and rises within a
few minutes of GRPO on CPU; it learns the sums faster than the bare format (it plateaus there).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._env import SingleTurnEnvironment, unit_ranges
from telescope_rollout.parsers import extract_last_number, strip_eos, strip_think_tags

_BARE = re.compile(r"\s*(-?\d+)\.?\s*")


def score_addition(completion: str, answer: str) -> tuple[float, bool, bool]:
    """(reward, bare right number, last number right)."""
    text = strip_think_tags(completion)
    m = _BARE.fullmatch(text)
    exact = m is not None and m.group(1) == answer
    last = extract_last_number(text[-10_000:]) == answer
    return (1.0 if exact else 0.5 if last else 0.0), exact, last


def addition_reward(completion: str, answer: str) -> RewardResult:
    """:func:`score_addition` as a RewardResult with its ``exact`` and ``correct`` metrics."""
    reward, exact, last = score_addition(completion, answer)
    return RewardResult(
        reward, {"exact": float(exact), "correct": float(last)}, {"exact": answer, "correct": answer}
    )


class AdditionSums:
    """The sums task, for an environment of any kind: kwargs ``num_samples`` (2000), ``seed`` (0),
    ``max_operand`` (99), its samples (:meth:`sums`) and its metrics' ranges."""

    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges("exact", "correct")
    reward_min = 0.0
    reward_max = 1.0
    num_samples: int = 2000
    seed: int = 0
    max_operand: int = 99

    def sums(self, num_samples: int | None = -1) -> list[Sample]:
        """The first ``num_samples`` sums (-1: ``self.num_samples``), the same for a seed."""
        rng = random.Random(self.seed)
        n = self.num_samples if num_samples is None or num_samples < 0 else num_samples
        samples: list[Sample] = []
        for _ in range(n):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            prompt = f"What is {a} + {b}? Reply with just the number."
            samples.append(Sample(prompt, str(a + b), {"a": a, "b": b}))
        return samples


class QuickstartAddEnv(AdditionSums, SingleTurnEnvironment):
    """Two-number addition in one turn (the sums task: :class:`AdditionSums`)."""

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        return self._set_samples(self.sums(num_samples), -1)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return addition_reward(strip_eos(completion, eos_token or self.eos_token), sample.answer)
