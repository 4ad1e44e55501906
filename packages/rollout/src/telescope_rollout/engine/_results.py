"""What the rollout engine hands out: scored samples (with their turns), groups, batches, events.

Plain dataclasses, so the training loop can turn them into Parquet rows and trainer samples
without knowing the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class Turn:
    """One model turn or one environment response of a sample, in episode order.

    A single-turn sample has one model turn. A multi-turn episode alternates model turns and
    environment responses (an environment step whose reply is empty and that ends the episode
    adds none). Times are wall clock (``time.time()`` seconds); -1 marks a number that does not
    apply or is unknown.
    """

    index: int
    """Position in the episode, from 0."""
    role: Literal["model", "env"]
    turn_type: str
    """``generation`` for model turns; for environment turns the first reply message's
    ``turn_type`` (env_response, tool_result, feedback, context; default env_response)."""
    text: str = ""
    """The generated text, or the reply messages' contents joined by blank lines."""
    tokens: int = -1
    """Model turns: completion tokens. Environment turns: the context tokens the reply added
    (the template's closing tokens of the model turn, the framed reply, the next generation
    prompt), so model and environment turns add up to the sample's completion; -1 for a reply
    that ended the episode (never tokenized)."""
    prompt_tokens: int = -1
    """Model turns: token ids sent with the request; -1 for environment turns."""
    stop_reason: str | None = None
    """Model turns: vLLM's finish reason."""
    server: str = ""
    """Model turns: the server's URL."""
    version_start: int = -1
    """Model turns: weight version live on the server when the request was sent (-1: unknown, evals)."""
    version_end: int = -1
    """Model turns: weight version live on the server when the answer came back."""
    start: float = 0.0
    """When the request was sent / ``env.step`` was called."""
    end: float = 0.0
    """When the answer came back / ``env.step`` returned."""
    request_id: str = ""
    """Model turns: the request id sent to the server."""
    segment: int = 0
    """The training sequence of the sample the turn is in: 0, or for an agent that rewrote its
    history the index of the further sequence (``ScoredSample.extra_sequences[segment - 1]``)."""
    timings: dict[str, float] = field(default_factory=dict[str, float])
    """Model turns, seconds: ``e2e_s`` (the request's round trip measured by the client) always;
    vLLM's own ``queue_s``, ``prefill_s``, ``decode_s``, ``inference_s`` (prefill + decode) and
    ``ttft_s`` (queue + prefill) only when the server runs with ``--enable-per-request-metrics``
    (vLLM >= 0.32 then returns a ``metrics`` object with each completion)."""


@dataclass
class TrainingSequence:
    """A further training sequence of a sample: an agent that rewrote its history made more than
    one (docs/rollout.md, "Agents"); ``reason`` says why this one began."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    reason: str
    teacher_logprobs: Sequence[float] | None = None
    """The teacher's logprob of each completion token (a run with a teacher, ``scorers``)."""
    ref_logprobs: Sequence[float] | None = None
    """The reference model's logprob of each completion token (a run with a reference KL)."""


@dataclass
class ScoredSample:
    """One completion of a group, with its reward and everything needed to train on it."""

    group_id: int
    sample_id: int
    env_name: str
    prompt_ids: list[int] = field(default_factory=list[int])
    completion_ids: Sequence[int] = field(default_factory=list[int])
    """The completion's tokens; a finished sample's are a :class:`TokenArray` (so are its mask and
    logprobs: one object each for the garbage collector, not one slot a token)."""
    completion_mask: Sequence[int] = field(default_factory=list[int])
    """1 for model tokens (trained on), 0 for template/environment tokens of later turns."""
    completion_logprobs: Sequence[float] = field(default_factory=list[float])
    """vLLM's logprob of each model token (0.0 where the mask is 0)."""
    teacher_logprobs: Sequence[float] | None = None
    """The teacher's logprob of each completion token, where the run has a teacher (the engine's
    ``scorers``; a :class:`TokenArray`); None otherwise."""
    ref_logprobs: Sequence[float] | None = None
    """The reference model's logprob of each completion token, where the run has one; None otherwise."""
    reward: float = 0.0
    advantage: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict[str, float])
    golden_answers: dict[str, str | None] = field(default_factory=dict[str, str | None])
    info_turns: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    sample_tags: dict[str, str] = field(default_factory=dict[str, str])
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
    """None, or the error kind: prompt_too_long, rollout_error, sample_error, empty_trajectory,
    scoring_error (a teacher or reference server failed), cancelled."""
    error_detail: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    """The environment's tool-call records (``ToolEnvironment``: see its ``env_response``)."""
    timings: dict[str, float] = field(default_factory=dict[str, float])
    """generation_s, reward_s, queue_s (clock seconds)."""
    turns: list[Turn] = field(default_factory=list[Turn])
    """Every model turn and environment response completed, in order (a cancelled sample keeps
    the ones it completed)."""
    system_prompt: str = ""
    """The prompt's system message, or "" when it has none."""
    sample_index: int = -1
    """The prompt's index in its environment's dataset."""
    dispatched_at: float | None = None
    """Wall clock (``time.time()``) when its group was dispatched (evals: when its request was
    about to be sent); None until then. A time that did not happen is None, never 0.0, so that no
    reader mistakes it for the epoch."""
    finished_at: float | None = None
    """Wall clock when its reward was computed, or when it failed or was cancelled (None: not yet)."""
    reward_start: float | None = None
    """Wall clock when ``compute_reward`` was called (None: never, e.g. a cancelled sample)."""
    reward_end: float | None = None
    """Wall clock when ``compute_reward`` returned or raised (None: never)."""
    extra_sequences: list[TrainingSequence] = field(default_factory=list[TrainingSequence])
    """Training sequences beyond the one in the fields above (an agent that rewrote its history);
    each is trained with the sample's advantage."""

    @property
    def num_model_tokens(self) -> int:
        return sum(self.completion_mask) + sum(sum(x.completion_mask) for x in self.extra_sequences)


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
class EngineEvent:
    """Something the engine did, for the orchestrator's timeline (``RolloutEngine(on_event=...)``).

    ``kind`` and its ``detail`` (JSON-able):
    - ``dispatch_paused`` (version, max_async_rollout) / ``dispatch_resumed`` (version, paused_s):
      the async limit stopped / restarted dispatch;
    - ``batch_assembled`` (kept, discarded, cancelled: group counts, unrecorded drops included);
    - ``group_cancelled`` (reason, group_id, server);
    - ``servers_drained`` (servers, reason, cancelled_groups) / ``servers_restored`` (servers, version);
    - ``server_lost`` (servers, reason, cancelled_groups) / ``server_back`` (servers, version);
    - ``weights_updated`` (version, servers);
    - ``environment_flat`` (env, groups, message): an environment's last ``groups`` groups were all
      dropped for zero advantage while others were kept (it trains nothing; a warning).
    """

    kind: str
    time: float
    """Wall clock (``time.time()`` seconds)."""
    step: int
    """The batch being filled (``batch_assembled``: the batch just handed out)."""
    detail: dict[str, Any] = field(default_factory=dict[str, Any])


@dataclass
class RolloutBatch:
    """One training step's worth of kept groups, plus what was dropped meanwhile."""

    step: int
    groups: list[ScoredGroup]
    discarded: list[DroppedGroup] = field(default_factory=list[DroppedGroup])
    cancelled: list[DroppedGroup] = field(default_factory=list[DroppedGroup])
    metrics: dict[str, float] = field(default_factory=dict[str, float])

    @property
    def samples(self) -> list[ScoredSample]:
        return [s for g in self.groups for s in g.samples]
