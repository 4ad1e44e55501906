"""Dedicated evals: math500, aime_2024, aime_2025 and gpqa_diamond (docs/rollout.md, "Evals and pass@k").

They are single-turn environments (``kind = "eval"``), so their prompts go through the chat
template like every environment's (a model is evaluated on prompts shaped as in training, never
on the raw question). Any environment name also works as an eval; these exist for benchmarks
that have no training set.

Hub datasets and the columns ``row_to_sample`` reads:

* math500, ``HuggingFaceH4/MATH-500`` split test: ``problem``, ``answer``, ``subject``, ``level``
  (an int, or a "Level N" string); metrics ``correct`` and ``level``, tag ``subject``.

Every one declares ``success_metrics = ("correct",)``: a bare ``pass_k: [1, 4]`` gives pass@k of
``correct`` only (never of math500's ``level``).
* aime_2024, ``HuggingFaceH4/aime_2024`` split train: ``problem``, ``answer``.
* aime_2025, ``opencompass/AIME2025`` configs ``AIME2025-I`` and ``AIME2025-II`` split test,
  concatenated: ``question`` (or ``problem``), ``answer``.
* gpqa_diamond, ``Idavidrein/gpqa`` config ``gpqa_diamond`` split train (gated: accept its terms
  on the hub and log in): ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``. The four
  choices are shuffled with ``random.Random(shuffle_seed)`` (42) drawn in row order, so the first
  N rows get the same letters whatever N is; metric ``correct`` from the last "Answer: X" (X an
  upper-case A-D standing alone, so "Answer: because ..." is no answer).

The math evals append "Please reason step by step, and put your final answer within \\boxed{}."
to the problem and score the think-stripped last ``\\boxed{}`` with :func:`verify_math_answer`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from itertools import chain
from typing import Any, ClassVar

from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._data import HubDatasetEnv, hub_rows, take_samples
from telescope_rollout.envs._env import unit_ranges
from telescope_rollout.envs.boxed_math import score_math
from telescope_rollout.parsers import strip_eos, strip_think_tags

BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. The last line of your response should be of the "
    "form 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before "
    "answering.\n\n"
)
_ANSWER = re.compile(r"(?i:answer)\s*:\s*\$?\s*\(?([A-D])\)?\$?(?![A-Za-z0-9])")
"""``Answer: X`` with an upper-case letter standing alone (optionally in ``$..$`` or parentheses);
"Answer: because ..." or "answer: definitely C" are no answer."""


class HubEval(HubDatasetEnv):
    """Base of the dedicated evals: a hub dataset (``subsets`` concatenated), mapped row by row.

    Kwargs: ``dataset``/``dataset_name``, ``subset``/``dataset_subset``, ``split``/``dataset_split``.
    """

    kind: ClassVar[str] = "eval"
    optional: ClassVar[tuple[str, ...]] = ("math-verify", "datasets")
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges("correct")
    success_metrics: ClassVar[tuple[str, ...] | None] = ("correct",)
    reward_min = 0.0
    reward_max = 1.0
    subsets: tuple[str | None, ...] = (None,)
    split = "test"

    def hub_rows(self) -> Iterable[dict[str, Any]]:
        subsets = (self.subset,) if self.subset else self.subsets
        return chain.from_iterable(hub_rows(self.dataset, s, self.split) for s in subsets)


class _BoxedMathEval(HubEval):
    suffix: str = BOXED_SUFFIX

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        question = row.get("problem", row.get("question"))
        answer = row.get("answer")
        if not isinstance(question, str) or not question or answer is None or str(answer) == "":
            return None
        return Sample(question + self.suffix, str(answer), {"question": question})

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return score_math(completion, sample.answer, eos_token or self.eos_token)


def _level(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace("Level", "").strip())
        except ValueError:
            return None
    return None


class Math500Eval(_BoxedMathEval):
    """MATH-500: 500 competition problems; metrics ``correct`` and ``level`` (1-5), tag ``subject``."""

    dataset = "HuggingFaceH4/MATH-500"
    split = "test"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        sample = super().row_to_sample(row)
        if sample is not None:
            sample.metadata.update(subject=str(row.get("subject") or ""), level=_level(row.get("level")))
        return sample

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        result = super().compute_reward(completion, sample, eos_token)
        if sample.metadata.get("level") is not None:
            result.sample_metrics["level"] = float(sample.metadata["level"])
        result.sample_tags["subject"] = str(sample.metadata.get("subject", ""))
        return result


class Aime2024Eval(_BoxedMathEval):
    """AIME 2024: 30 problems with integer answers."""

    dataset = "HuggingFaceH4/aime_2024"
    split = "train"


class Aime2025Eval(_BoxedMathEval):
    """AIME 2025 I and II: 30 problems with integer answers."""

    dataset = "opencompass/AIME2025"
    subsets = ("AIME2025-I", "AIME2025-II")
    split = "test"


def extract_choice(text: str) -> str:
    """The letter of the last "Answer: X" (X one of A-D, upper case, standing alone; "answer" in
    any case), or "" when there is none."""
    found = _ANSWER.findall(text)
    return found[-1] if found else ""


class GpqaDiamondEval(HubEval):
    """GPQA Diamond: 198 graduate-level multiple-choice science questions (choices shuffled)."""

    dataset = "Idavidrein/gpqa"
    subsets = ("gpqa_diamond",)
    split = "train"
    shuffle_seed: int = 42
    instruction: str = GPQA_INSTRUCTION

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        rng = random.Random(self.shuffle_seed)
        samples = take_samples(self.hub_rows(), lambda row: self.row_to_sample(row, rng), num_samples)
        return self._set_samples(samples, num_samples)

    def row_to_sample(self, row: dict[str, Any], rng: random.Random | None = None) -> Sample | None:
        keys = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        question, choices = row.get("Question"), [row.get(k) for k in keys]
        if not isinstance(question, str) or not all(isinstance(c, str) for c in choices):
            return None
        order = list(range(4))
        (rng or random.Random(self.shuffle_seed)).shuffle(order)
        letter = "ABCD"[order.index(0)]
        lines = "\n".join(f"{'ABCD'[i]}) {str(choices[j]).strip()}" for i, j in enumerate(order))
        prompt = f"{self.instruction}{question.strip()}\n\n{lines}"
        return Sample(prompt, letter, {"question": question})

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        text = strip_think_tags(strip_eos(completion, eos_token or self.eos_token))
        ok = extract_choice(text) == sample.answer
        return RewardResult(float(ok), {"correct": float(ok)}, {"correct": sample.answer})
