"""Math word problems with a ``\\boxed{}`` final answer: hendrycks_math, dapo_math, deepscaler.

The three differ only in their hub dataset and its columns (``row_to_sample`` maps one hub row
and returns None for a row without a usable question or answer):

* hendrycks_math, ``justus27/math-hendrycks-genesys-format``: ``prompt`` (str) and
  ``verification_info``, a JSON string (or dict) whose ``ground_truth`` string is the answer.
* dapo_math, ``BytedTsinghua-SIA/DAPO-Math-17k``: ``prompt`` is a chat list whose first
  message's ``content`` is the question; ``reward_model`` (a dict or JSON string) holds
  ``ground_truth``, which must be a non-empty string.
* deepscaler, ``agentica-org/DeepScaleR-Preview-Dataset``: non-empty strings ``problem`` and ``answer``.

Metric ``correct`` ∈ {0, 1}: the think-stripped completion's last ``\\boxed{}`` checked with
math-verify (extra ``math``) or the plain fallback; the golden answer is the ground truth.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, cast

from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._data import HubDatasetEnv
from telescope_rollout.envs._env import unit_ranges
from telescope_rollout.envs._math import verify_math_answer
from telescope_rollout.parsers import extract_boxed_answer, strip_eos, strip_think_tags

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and then "
    "provide the user with the answer."
)


def score_math(completion: str, answer: str, eos_token: str = "") -> RewardResult:
    """Reward 1 when the last ``\\boxed{}`` answer of ``completion`` equals ``answer`` (math-verify)."""
    text = strip_think_tags(strip_eos(completion, eos_token))
    pred = extract_boxed_answer(text)
    ok = verify_math_answer(pred, answer)
    return RewardResult(float(ok), {"correct": float(ok)}, {"correct": answer})


def _json_dict(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


class MathEnv(HubDatasetEnv):
    """Base for boxed-answer math tasks; subclasses name the hub dataset and map its rows.

    Kwargs: ``dataset`` (hub name or ``"bundled"``; alias ``dataset_name``), ``subset``
    (``dataset_subset``), ``split`` (``dataset_split``).
    """

    optional: ClassVar[tuple[str, ...]] = ("math-verify", "datasets")
    system_prompt = SYSTEM_PROMPT
    instruction_prompt = (
        "Solve the following math problem. Show your work, then put your final answer in \\boxed{}."
    )
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges("correct")
    reward_min = 0.0
    reward_max = 1.0
    bundled_file = "math.jsonl"

    def bundled_row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        return Sample(row["problem"], str(row["answer"]))

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return score_math(completion, sample.answer, eos_token or self.eos_token)


class HendrycksMathEnv(MathEnv):
    """Hendrycks MATH in the genesys format (``hendrycks_math``)."""

    dataset = "justus27/math-hendrycks-genesys-format"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        info = _json_dict(row.get("verification_info"))
        question = row.get("prompt")
        if not isinstance(question, str) or info is None or not isinstance(info.get("ground_truth"), str):
            return None
        return Sample(question, info["ground_truth"], {"question": question, "task": "hendrycks-math"})


class DapoMathEnv(MathEnv):
    """DAPO-Math-17k (``dapo_math``)."""

    dataset = "BytedTsinghua-SIA/DAPO-Math-17k"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        prompt = row.get("prompt")
        if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
            return None
        question = cast(dict[str, Any], prompt[0]).get("content")
        answer = (_json_dict(row.get("reward_model")) or {}).get("ground_truth")
        if not isinstance(question, str) or not isinstance(answer, str) or not answer:
            return None
        meta = {"question": question, "data_source": row.get("data_source") or "", "task": "dapo-math"}
        return Sample(question, answer, meta)


class DeepScalerEnv(MathEnv):
    """DeepScaleR-Preview (``deepscaler``)."""

    dataset = "agentica-org/DeepScaleR-Preview-Dataset"

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        question, answer = row.get("problem"), row.get("answer")
        if not (isinstance(question, str) and question and isinstance(answer, str) and answer):
            return None
        return Sample(question, answer, {"question": question, "task": "deepscaler"})
