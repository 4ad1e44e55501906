"""Environment base classes: single-turn and multi-turn tasks (docs/rollout.md, "The environment API").

An environment hands out :class:`Sample` objects, formats them into prompts through the chat
template, and scores completions. Hooks may be written sync or async; the rollout engine calls
them through :meth:`Environment.score` and :meth:`MultiTurnEnvironment.step`, which await when
needed.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, cast

from telescope_rollout._types import EvalMetricsResult, Message, RewardResult, RolloutState, Sample


def unit_ranges(*names: str, inverted: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``metrics_ranges`` for metrics between 0 and 1: ``{name: {"min": 0.0, "max": 1.0, "invert": ...}}``;
    ``inverted`` are the ones where lower is better (drawn upside down)."""
    return {n: {"min": 0.0, "max": 1.0, "invert": n in inverted} for n in (*names, *inverted)}


class ChatRenderer(Protocol):
    """Anything that renders messages to a prompt string: our :class:`Tokenizer` or an HF tokenizer."""

    def apply_chat_template(self, messages: list[Message], **kwargs: Any) -> Any: ...


async def maybe_await(value: Any) -> Any:
    """Await ``value`` when it is awaitable, so hooks may be sync or async."""
    if inspect.isawaitable(value):
        return await value
    return value


def as_reward_result(value: Any) -> RewardResult:
    """Accept a RewardResult, or a bare number as the total reward."""
    if isinstance(value, EvalMetricsResult):  # metrics without a reward: compute_eval_metrics' result
        raise TypeError("compute_reward must return a RewardResult or a number, got an EvalMetricsResult")
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return RewardResult(total_reward=float(value))
    raise TypeError(f"compute_reward must return a RewardResult or a number, got {type(value).__name__}")


def render_prompt(
    tokenizer: ChatRenderer,
    messages: list[Message],
    *,
    add_thinking_prefix: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render messages for generation; with a thinking prefix the reply is opened with ``<think>``."""
    kwargs = dict(chat_template_kwargs or {})
    if add_thinking_prefix:
        messages = [*messages, {"role": "assistant", "content": "<think>"}]
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False, continue_final_message=True, **kwargs
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def initial_messages(sample: Sample, system_prompt: str | None) -> list[Message]:
    """A conversation's opening: the sample's own message list, or [system?] + the user message."""
    if isinstance(sample.prompt, list):
        return list(sample.prompt)
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": sample.prompt})
    return messages


class Environment(ABC):
    """Base of every environment.

    Every extra constructor keyword becomes an attribute, so config ``kwargs`` reach the
    environment unchanged. ``reward_min``/``reward_max`` only scale the UI's charts.
    """

    kind: ClassVar[str] = "single"
    requires: ClassVar[tuple[str, ...]] = ()
    """Distributions needed at run time beyond telescope-rollout (shown by ``telescope envs list``)."""
    optional: ClassVar[tuple[str, ...]] = ()
    """Distributions used when present (e.g. math-verify, datasets for hub data)."""
    needs: ClassVar[tuple[str, ...]] = ()
    """Run-time resources that are not packages (e.g. "sandbox")."""
    eos_token: str = "<|endoftext|>"
    reward_min: float | None = None
    reward_max: float | None = None
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {}
    tags_options: ClassVar[dict[str, list[str]]] = {}
    success_metrics: ClassVar[tuple[str, ...] | None] = None
    """The metrics that say whether a completion succeeded (> 0), for an eval's pass@k when its
    ``pass_k`` names no metrics; ``None``: every metric whose values all lie in [0, 1]."""
    is_multi_turn: ClassVar[bool] = False

    def __init__(self, eos_token: str | None = None, add_thinking_prefix: bool = False, **kwargs: Any):
        if eos_token is not None:
            self.eos_token = eos_token
        self.add_thinking_prefix = add_thinking_prefix
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._samples: list[Sample] = []
        self._name: str | None = None

    @property
    def name(self) -> str:
        """The registry/config name, or the class name before registration."""
        return self._name or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @abstractmethod
    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        """Load (and store in ``self._samples``) the samples; ``num_samples=-1`` means all."""

    def template_kwargs(self) -> dict[str, Any]:
        """Extra chat-template variables for this environment's prompts (e.g. ``tools``).

        The rollout engine merges them into the kwargs of every render of this environment's
        conversations (first prompt and multi-turn framing alike); default none.
        """
        return {}

    async def prepare_resources(self) -> None:
        """Start expensive resources (sandbox pools, clients) before the first rollout."""
        return None

    def get_sample(self, idx: int) -> Sample:
        return self._samples[idx]

    def __len__(self) -> int:
        return len(self._samples)

    def _set_samples(self, samples: list[Sample], num_samples: int | None) -> list[Sample]:
        self._samples = samples if num_samples is None or num_samples < 0 else samples[:num_samples]
        return self._samples


class SingleTurnEnvironment(Environment):
    """One prompt, one completion, one reward.

    Subclasses implement ``load_dataset`` and ``compute_reward(completion, sample, eos_token)``
    (sync or async, returning a RewardResult or a number).
    """

    system_prompt: str | None = None
    instruction_prompt: str | None = None

    def __init__(
        self, system_prompt: str | None = None, instruction_prompt: str | None = None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if instruction_prompt is not None:
            self.instruction_prompt = instruction_prompt

    def build_messages(self, question: str | list[Message]) -> list[Message]:
        """System prompt (if any) + the user message (instruction, blank line, question)."""
        if isinstance(question, list):
            return list(question)
        content = f"{self.instruction_prompt}\n\n{question}" if self.instruction_prompt else question
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": content})
        return messages

    def format_prompt(
        self,
        question: str | list[Message],
        tokenizer: ChatRenderer,
        add_thinking_prefix: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt string sent to the inference server."""
        thinking = self.add_thinking_prefix if add_thinking_prefix is None else add_thinking_prefix
        return render_prompt(
            tokenizer,
            self.build_messages(question),
            add_thinking_prefix=thinking,
            chat_template_kwargs={**self.template_kwargs(), **(chat_template_kwargs or {})},
        )

    @abstractmethod
    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> Any:
        """Score one completion (sync or async)."""

    async def score(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """Await ``compute_reward`` whatever its flavour and normalise the result."""
        return as_reward_result(await maybe_await(self.compute_reward(completion, sample, eos_token)))

    async def compute_eval_metrics(
        self, completion: str, sample: Sample, eos_token: str = ""
    ) -> EvalMetricsResult:
        """Default: the reward's sample metrics."""
        r = await self.score(completion, sample, eos_token)
        return EvalMetricsResult(r.sample_metrics, r.golden_answers, r.info_turns, r.sample_tags)


class MultiTurnEnvironment(Environment):
    """A conversation: the model speaks, the environment answers, until ``is_done``.

    Subclasses implement ``load_dataset``, ``env_response(messages, state)`` and
    ``compute_reward(state, eos_token)`` (each sync or async).
    """

    kind: ClassVar[str] = "multi"
    is_multi_turn: ClassVar[bool] = True
    max_turns: int = 10
    system_prompt: str | None = None

    def __init__(self, max_turns: int | None = None, system_prompt: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if max_turns is not None:
            self.max_turns = max_turns
        if system_prompt is not None:
            self.system_prompt = system_prompt

    def create_initial_state(self, sample: Sample) -> RolloutState:
        return RolloutState(sample=sample, env_name=str(sample.metadata.get("_env_name", self.name)))

    def get_initial_prompt(self, sample: Sample, tokenizer: ChatRenderer | None = None) -> list[Message]:
        """[system?] + the user message, or the sample's own message list."""
        return initial_messages(sample, self.system_prompt)

    @abstractmethod
    def env_response(self, messages: list[Message], state: RolloutState) -> Any:
        """The environment's reply messages to the model's last turn (sync or async)."""

    def is_done(self, state: RolloutState) -> tuple[bool, str | None]:
        """Called after each env_response; default stops at ``max_turns``."""
        if state.num_turns >= self.max_turns:
            return True, "max_turns_reached"
        return False, None

    def get_next_prompt_messages(self, state: RolloutState, env_messages: list[Message]) -> list[Message]:
        last = state.trajectory[-1]
        return [*last.prompt, *last.completion, *env_messages]

    async def step(
        self, messages: list[Message], state: RolloutState
    ) -> tuple[list[Message], bool, str | None]:
        """Run one environment turn: the reply, then ``is_done``. Updates ``state`` in place."""
        reply = list(await maybe_await(self.env_response(messages, state)) or [])
        done, reason = await maybe_await(self.is_done(state))
        if done:
            state.is_completed = True
            state.stop_reason = reason
        return reply, done, reason

    @abstractmethod
    def compute_reward(self, state: RolloutState, eos_token: str = "") -> Any:
        """Score a finished rollout (sync or async)."""

    async def score(self, state: RolloutState, eos_token: str = "") -> RewardResult:
        return as_reward_result(await maybe_await(self.compute_reward(state, eos_token)))

    async def compute_eval_metrics(self, state: RolloutState, eos_token: str = "") -> EvalMetricsResult:
        r = await self.score(state, eos_token)
        return EvalMetricsResult(r.sample_metrics, r.golden_answers, r.info_turns, r.sample_tags)


def environments_by_name(environments: Mapping[str, Environment] | Any) -> dict[str, Environment]:
    """``{name: Environment}`` from such a mapping or from the list ``build_environments`` returns."""
    if isinstance(environments, Mapping):
        return dict(cast(Mapping[str, Environment], environments))
    return {b.name: b.env for b in environments}
