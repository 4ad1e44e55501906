"""countdown: reach a target number with the given numbers and + - * /.

Reward (max 2.0) = ``_format_reward`` (1.0 for ``<think>…</think><answer>…</answer>`` whose
answer holds only arithmetic characters, 0.5 if it holds others; a leading ``<think>`` is
assumed present) + ``_equation_reward`` (1.0 when the last answer uses exactly the given
numbers and evaluates within 1e-5 of the target; golden answer = the target).

Hub rows (``Jiayi-Pan/Countdown-Tasks-3to4``): ``nums`` (a list of
ints) and ``target`` (an int); see :meth:`CountdownEnv.row_to_sample`.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, TypeGuard, cast

from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._data import HubDatasetEnv
from telescope_rollout.envs._env import unit_ranges
from telescope_rollout.envs._rubric import Rubric
from telescope_rollout.parsers import extract_answer_tags, strip_eos

_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>(.*?)</answer>\s*$", re.S)
_ARITH = re.compile(r"^[\d+\-*/().\s]+$")
_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def safe_eval(expr: str) -> float | None:
    """Evaluate ``+ - * /`` over number literals and parentheses; None for anything else."""
    if len(expr) > 200 or not _ARITH.match(expr):
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def ev(node: ast.AST) -> float:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, _OPS):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            return a / b
        raise ValueError("not arithmetic")

    try:
        return ev(tree.body)
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def format_reward(completion: str) -> float:
    """1 for ``...</think><answer>ARITHMETIC</answer>`` (the prompt opens the think tag), 0.5 when
    the answer is not plain arithmetic, 0 without that layout."""
    m = _FORMAT.match("<think>" + completion)
    if not m:
        return 0.0
    return 1.0 if _ARITH.match(m.group(1)) else 0.5


def equation_reward(completion: str, nums: list[int], target: float) -> float:
    """1 when the answer uses each of ``nums`` exactly once and evaluates to ``target``, else 0."""
    answer = extract_answer_tags(completion)
    if answer is None or len(answer) > 200:
        return 0.0
    used = [int(x) for x in re.findall(r"\d+", answer)]
    if Counter(used) != Counter(int(n) for n in nums):
        return 0.0
    value = safe_eval(answer)
    return 1.0 if value is not None and abs(value - float(target)) < 1e-5 else 0.0


class CountdownEnv(HubDatasetEnv):
    """Kwargs: ``dataset`` (hub name, or ``"bundled"``; alias ``dataset_name``), ``subset``
    (``dataset_subset``), ``split`` (``dataset_split``)."""

    system_prompt = (
        "You are a helpful assistant. You first think about the reasoning process in your mind and then "
        "provide the user with the answer."
    )
    instruction_prompt = (
        "Show your work in <think> </think> tags. And return the final equation in <answer> </answer> tags, "
        "for example <answer> (1 + 2) / 3 </answer>."
    )
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges("_format_reward", "_equation_reward")
    reward_min = 0.0
    reward_max = 2.0
    dataset = "Jiayi-Pan/Countdown-Tasks-3to4"
    bundled_file = "countdown.jsonl"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.rubric = Rubric()
        self.rubric.add_reward(self._format_reward, range_min=0.0, range_max=1.0)
        self.rubric.add_reward(self._equation_reward, range_min=0.0, range_max=1.0)

    @staticmethod
    def question(nums: list[int], target: int) -> str:
        return (
            f"Using the numbers {list(nums)}, create an equation that equals {target}. You can use basic "
            "arithmetic operations (+, -, *, /) and each number can only be used once."
        )

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        """One hub row (``nums``, ``target``) as a Sample; None for a malformed row."""
        nums, target = row.get("nums"), row.get("target")
        items = cast(Sequence[object], nums) if isinstance(nums, list | tuple) else None
        if items is None or not all(_is_int(n) for n in items) or not _is_int(target):
            return None
        numbers = [int(n) for n in cast(Sequence[int], items)]
        question = self.question(numbers, target)
        return Sample(question, str(target), {"question": question, "nums": numbers, "target": target})

    def _format_reward(self, completion: str, eos_token: str = "") -> float:
        return format_reward(strip_eos(completion, eos_token))

    def _equation_reward(self, completion: str, sample: Sample) -> tuple[float, str]:
        return equation_reward(completion, sample.metadata["nums"], float(sample.answer)), sample.answer

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return await self.rubric.score(completion, sample, eos_token=eos_token or self.eos_token)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
