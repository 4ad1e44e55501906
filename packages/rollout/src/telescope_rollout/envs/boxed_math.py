"""Math word problems with a ``\\boxed{}`` final answer: hendrycks_math, dapo_math, deepscaler.

The three differ only in their hub dataset and its columns. Metric ``correct`` ∈ {0, 1}: the
think-stripped completion's last ``\\boxed{}`` checked with math-verify (extra ``math``) or the
plain fallback; the golden answer is the ground truth.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from telescope_rollout._env import SingleTurnEnvironment
from telescope_rollout._math import verify_math_answer
from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._data import BUNDLED, bundled_rows, hub_rows, take
from telescope_rollout.parsers import extract_boxed_answer, strip_eos, strip_think_tags


def score_math(completion: str, answer: str, eos_token: str = "") -> RewardResult:
    text = strip_think_tags(strip_eos(completion, eos_token))
    pred = extract_boxed_answer(text)
    ok = verify_math_answer(pred, answer)
    return RewardResult(float(ok), {"correct": float(ok)}, {"correct": answer})


class MathEnv(SingleTurnEnvironment):
    """Base for boxed-answer math tasks; subclasses name the hub dataset and map its rows."""

    optional: ClassVar[tuple[str, ...]] = ("math-verify", "datasets")
    instruction_prompt = (
        "Solve the following math problem. Show your work, then put your final answer in \\boxed{}."
    )
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "correct": {"min": 0.0, "max": 1.0, "invert": False}
    }
    reward_min = 0.0
    reward_max = 1.0
    dataset: str = ""
    subset: str | None = None
    split: str = "train"

    def row_to_sample(self, row: dict[str, Any]) -> Sample:
        raise NotImplementedError

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        if self.dataset == BUNDLED:
            samples = [
                Sample(r["problem"], str(r["answer"])) for r in take(bundled_rows("math.jsonl"), num_samples)
            ]
        else:
            samples = [
                self.row_to_sample(r)
                for r in take(hub_rows(self.dataset, self.subset, self.split), num_samples)
            ]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return score_math(completion, sample.answer, eos_token or self.eos_token)


class HendrycksMathEnv(MathEnv):
    dataset = "justus27/math-hendrycks-genesys-format"

    def row_to_sample(self, row: dict[str, Any]) -> Sample:
        info = row["verification_info"]
        info = json.loads(info) if isinstance(info, str) else info
        return Sample(row["prompt"], str(info["ground_truth"]))


class DapoMathEnv(MathEnv):
    dataset = "BytedTsinghua-SIA/DAPO-Math-17k"

    def row_to_sample(self, row: dict[str, Any]) -> Sample:
        return Sample(row["prompt"][0]["content"], str(row["reward_model"]["ground_truth"]))


class DeepScalerEnv(MathEnv):
    dataset = "agentica-org/DeepScaleR-Preview-Dataset"

    def row_to_sample(self, row: dict[str, Any]) -> Sample:
        return Sample(row["problem"], str(row["answer"]))
