"""What the rollout engine hands out: scored samples, groups and batches.

Plain dataclasses, so the training loop can turn them into Parquet rows and trainer samples
without knowing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScoredSample:
    """One completion of a group, with its reward and everything needed to train on it."""

    group_id: int
    sample_id: int
    env_name: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    """1 for model tokens (trained on), 0 for template/environment tokens of later turns."""
    completion_logprobs: list[float] = field(default_factory=list)
    """vLLM's logprob of each model token (0.0 where the mask is 0)."""
    reward: float = 0.0
    advantage: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    golden_answers: dict[str, str | None] = field(default_factory=dict)
    info_turns: list[dict[str, Any]] = field(default_factory=list)
    sample_tags: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None
    """vLLM's finish reason (single turn) or the episode's stop reason (multi-turn)."""
    is_truncated: bool = False
    """Cut off by max_tokens or the context ("length", "context_exhausted"): filter_overlong uses it."""
    num_turns: int = 0
    prompt_text: str = ""
    completion_text: str = ""
    version_start: int = 0
    """Weight version live when the sample's first request was dispatched."""
    version_end: int = 0
    """Weight version live when its generation ended."""
    off_policy_steps: int = 0
    """Weight updates that happened while it was generating."""
    server: str = ""
    lane: int = -1
    error: str | None = None
    """None, or the error kind: prompt_too_long, rollout_error, sample_error, empty_trajectory, cancelled."""
    error_detail: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    """generation_s, reward_s, queue_s (clock seconds)."""

    @property
    def num_model_tokens(self) -> int:
        return sum(self.completion_mask)


@dataclass
class ScoredGroup:
    """``group_size`` completions of one prompt."""

    group_id: int
    env_name: str
    samples: list[ScoredSample]
    prompt_text: str = ""
    sample_index: int = -1
    """The prompt's index in its environment's dataset."""
    server: str = ""
    version_start: int = 0
    """Oldest weight version any of its samples started under."""
    staleness: int = 0
    """Batch step it landed in minus ``version_start``."""

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


@dataclass
class DroppedGroup:
    """A group left out of training, kept for inspection."""

    group: ScoredGroup
    reason: str
    """max_async, zero_advantage, off_policy, eval_drain (cancelled: its server was drained for an
    eval), or an error kind (rollout_error, prompt_too_long, ...). A prompt that cannot fit the
    context is dropped at dispatch: prompt_too_long, no server, its samples never started."""
    step: int
    """The batch that was being filled when it was dropped."""
    version: int
    """Weight version live at that moment."""


@dataclass
class RolloutBatch:
    """One training step's worth of kept groups, plus what was dropped meanwhile."""

    step: int
    groups: list[ScoredGroup]
    discarded: list[DroppedGroup] = field(default_factory=list)
    cancelled: list[DroppedGroup] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> list[ScoredSample]:
        return [s for g in self.groups for s in g.samples]
