"""Agents as environments: a program written against the OpenAI API, trained as it is.

An :class:`AgentEnvironment` gets, for each episode, an :class:`AgentEndpoint` (a base URL and
key of the rollout engine's gateway, docs/rollout.md "Agents") and runs the agent against it:
by default :meth:`AgentEnvironment.run` with an ``openai.AsyncOpenAI`` client pointed there
(``pip install 'telescope-rollout[agents]'``). Every call the agent makes is a model turn of the
sample; its tokens are the sampled ones. When the agent returns, :meth:`compute_reward` scores the
:class:`AgentEpisode` (what ``run`` returned, the calls, the final conversation); by default what
``run`` returned is the reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from telescope_rollout._types import Message, RewardResult, Sample
from telescope_rollout.envs._env import Environment, as_reward_result, initial_messages, maybe_await

__all__ = ["AgentEndpoint", "AgentEnvironment", "AgentEpisode"]


@dataclass(frozen=True)
class AgentEndpoint:
    """Where one episode's agent sends its OpenAI calls: ``base_url`` (ending in ``/v1``), its own
    ``api_key`` and the ``model`` name to ask for (any name is answered by the run's model)."""

    base_url: str
    api_key: str
    model: str


@dataclass
class AgentEpisode:
    """What an agent's episode did, for its reward: the ``sample``, what the agent returned
    (``result``), each answered call (``calls``: the assistant message returned, its finish reason,
    the segment it belongs to), the conversation of its last call with the last answer
    (``messages``), how many training sequences it made (``segments``) and why it stopped."""

    sample: Sample
    result: Any
    calls: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    messages: list[Message] = field(default_factory=list[Message])
    segments: int = 1
    stop_reason: str = "agent_done"

    @property
    def final_answer(self) -> str:
        """The content of the last answer the agent received ("" without one)."""
        return str(self.calls[-1]["message"].get("content") or "") if self.calls else ""


class AgentEnvironment(Environment):
    """An agent on the OpenAI API (module docstring). Subclasses implement ``load_dataset`` and
    ``run(client, sample)`` (or override :meth:`play` to run the agent some other way), and
    optionally ``compute_reward(episode)``."""

    kind: ClassVar[str] = "agent"
    is_multi_turn: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("openai",)
    max_calls: int = 32
    """Calls one episode may make; later ones are refused (and the episode stops counting them)."""
    agent_timeout_s: float = 600.0
    """An agent that has not returned by then is stopped; its sample fails with the reason."""
    tool_call_format: str = "xml"
    """How the model writes tool calls (``telescope_rollout.envs._toolcalls``)."""
    system_prompt: str | None = None

    def get_initial_prompt(self, sample: Sample) -> list[Message]:
        """The conversation the agent is expected to open with: for the run's checks that a prompt
        fits, and for the record's prompt text ([system?] + the sample's prompt)."""
        return initial_messages(sample, self.system_prompt)

    async def run(self, client: Any, sample: Sample) -> Any:
        """The agent: talk to the model through ``client`` (an ``openai.AsyncOpenAI``); return what
        the reward needs (a number is the reward by default)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement run(client, sample), or override play(endpoint, sample)"
        )

    async def play(self, endpoint: AgentEndpoint, sample: Sample) -> Any:
        """Run one episode against ``endpoint``; returns what ``run`` returned."""
        try:
            import openai
        except ImportError as exc:
            raise ImportError(
                f"{type(self).__name__} runs its agent with the openai client: "
                "pip install 'telescope-rollout[agents]'"
            ) from exc
        client = openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=self.agent_timeout_s
        )
        async with client:
            return await self.run(client, sample)

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> Any:
        """Default: what the agent returned, as the reward (a number or a RewardResult)."""
        return episode.result

    async def score(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        return as_reward_result(await maybe_await(self.compute_reward(episode, eos_token)))
