"""Data types shared by environments, rewards and the rollout loop.

Plain dataclasses and dicts only: these cross process boundaries and land in parquet tables, so
they carry no behaviour beyond small conveniences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
"""A chat message: ``role``, ``content``, optionally ``turn_type`` (env messages: ``env_response``,
``tool_result``, ``feedback``, ``context``)."""


@dataclass
class Sample:
    """One task instance: a prompt (text or messages), a reference answer, free-form metadata.

    The sampler adds ``metadata["_env_name"]`` (the config entry name) so that the reward is
    computed by the sample's own environment.
    """

    prompt: str | list[Message]
    answer: str = ""
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])


@dataclass
class RewardResult:
    """The score of one completion: the total reward and everything shown next to it.

    ``sample_metrics`` are per-sample numbers (averaged per step by the UI), ``golden_answers``
    the reference per metric, ``info_turns`` extra text rows (keys ``turn_order``, ``info_key``,
    ``info_value``, ``info_type``) and ``sample_tags`` categorical labels.
    """

    total_reward: float
    sample_metrics: dict[str, float] = field(default_factory=dict[str, float])
    golden_answers: dict[str, str | None] = field(default_factory=dict[str, str | None])
    info_turns: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    sample_tags: dict[str, str] = field(default_factory=dict[str, str])


class EvalMetricsResult(RewardResult):
    """Metrics of one completion under evaluation: a :class:`RewardResult` without a total reward
    (it stays 0; an eval reports only metrics). ``metrics`` is ``sample_metrics``."""

    def __init__(
        self,
        metrics: dict[str, float] | None = None,
        golden_answers: dict[str, str | None] | None = None,
        info_turns: list[dict[str, Any]] | None = None,
        sample_tags: dict[str, str] | None = None,
    ):
        super().__init__(0.0, metrics or {}, golden_answers or {}, info_turns or [], sample_tags or {})

    @property
    def metrics(self) -> dict[str, float]:
        return self.sample_metrics

    @metrics.setter
    def metrics(self, value: dict[str, float]) -> None:
        self.sample_metrics = value


@dataclass
class TrajectoryStep:
    """One model turn of a multi-turn rollout: what it saw and what it produced."""

    prompt: list[Message]
    completion: list[Message]
    prompt_token_ids: list[int] = field(default_factory=list[int])
    completion_token_ids: list[int] = field(default_factory=list[int])
    completion_logprobs: list[float] = field(default_factory=list[float])
    is_truncated: bool = False


@dataclass
class RolloutState:
    """Everything a multi-turn environment knows about one rollout in progress.

    ``custom`` is the environment's own scratch space (game state, tool records, ...), private to
    this rollout, so concurrent rollouts never share state.
    """

    sample: Sample
    env_name: str = ""
    trajectory: list[TrajectoryStep] = field(default_factory=list[TrajectoryStep])
    is_completed: bool = False
    stop_reason: str | None = None
    error: str | None = None
    custom: dict[str, Any] = field(default_factory=dict[str, Any])

    @property
    def num_turns(self) -> int:
        return len(self.trajectory)

    @property
    def last_completion_text(self) -> str:
        """The text of the model's last message, or "" before the first turn."""
        if not self.trajectory or not self.trajectory[-1].completion:
            return ""
        return str(self.trajectory[-1].completion[-1].get("content") or "")

    def get_full_completion_ids(self) -> list[int]:
        return [t for step in self.trajectory for t in step.completion_token_ids]

    def get_full_logprobs(self) -> list[float]:
        return [lp for step in self.trajectory for lp in step.completion_logprobs]
