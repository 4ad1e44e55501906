"""Agents as environments: a program written against the OpenAI API, trained as it is.

An :class:`AgentEnvironment` gets, for each episode, an :class:`AgentEndpoint` (a base URL and
key of the rollout engine's gateway, docs/rollout.md "Agents") and runs the agent against it:
by default :meth:`AgentEnvironment.run` with an ``openai.AsyncOpenAI`` client pointed there
(``pip install 'telescope-rollout[agents]'``). Every call the agent makes is a model turn of the
sample; its tokens are the sampled ones. When the agent returns, :meth:`compute_reward` scores the
:class:`AgentEpisode` (what ``run`` returned, the calls, the final conversation); by default what
``run`` returned is the reward.

A :class:`CommandAgentEnvironment` runs a program instead (any language, the OpenAI SDK or plain
HTTP) in the run's sandbox (``telescope-sandbox``'s local provider: bubblewrap, no network): the
endpoint is reachable from inside only, at ``OPENAI_BASE_URL`` with ``OPENAI_API_KEY``; the
sample's opening messages are in ``sample.json``; the files it leaves (``files_out``) are the
reward's to read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from telescope_rollout._types import Message, RewardResult, Sample
from telescope_rollout.envs._env import Environment, as_reward_result, initial_messages, maybe_await
from telescope_rollout.envs._sandbox import CommandResultLike, CommandSandboxLike

__all__ = ["AgentEndpoint", "AgentEnvironment", "AgentEpisode", "AgentError", "CommandAgentEnvironment"]

SAMPLE_FILE = "sample.json"
"""Where a command agent finds its sample: ``{"messages": [...], "metadata": {...}}`` (the opening
conversation and the metadata keys in ``shared_metadata``, never its answer)."""


class AgentError(RuntimeError):
    """An agent's own failure; its message is the sample's error as it stands."""


@dataclass(frozen=True)
class AgentEndpoint:
    """Where one episode's agent sends its OpenAI calls: ``base_url`` (ending in ``/v1``), its own
    ``api_key`` and the ``model`` name to ask for (any name is answered by the run's model). An
    episode served for a sandbox has ``socket_path``: the Unix socket behind ``base_url``'s path."""

    base_url: str
    api_key: str
    model: str
    socket_path: str | None = None

    @property
    def path(self) -> str:
        """``base_url`` without scheme and host (``/e/<episode>/v1``)."""
        return urlsplit(self.base_url).path


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
    def files(self) -> Mapping[str, bytes]:
        """The files a command agent left (its ``files_out`` that exist); empty for others."""
        return getattr(self.result, "files", None) or {}

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
    forwards_ports: ClassVar[bool] = False
    """True when the agent runs in a sandbox: its episode is served on a Unix socket of its own."""
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


class CommandAgentEnvironment(AgentEnvironment):
    """An agent that is a program, run in the sandbox once per episode (module docstring).

    Kwargs (besides the sandbox's: ``provider: local``, ``pool_size``): ``command`` (argv, run in
    the work directory), ``files`` (name in the work directory -> host file to copy there, e.g. the
    agent's script), ``files_out`` (names read back for the reward: ``episode.files``),
    ``memory_mb``, ``port`` (of the endpoint inside, 8000), ``shared_metadata`` (the sample's metadata
    keys it may see). ``agent_timeout_s`` counts from the request for a sandbox (a full pool's wait
    included: give the pool as many slots as episodes run at once). The program gets ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``, ``OPENAI_MODEL``, ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (the same
    episode through Anthropic's Messages API) and ``TELESCOPE_SAMPLE`` (the path of ``sample.json``); an
    exit status other than 0 fails the sample with the end of its stderr."""

    needs: ClassVar[tuple[str, ...]] = ("sandbox",)
    requires: ClassVar[tuple[str, ...]] = ()
    forwards_ports: ClassVar[bool] = True
    command: Sequence[str] = ()
    files: Mapping[str, str] = {}
    files_out: Sequence[str] = ()
    memory_mb: int = 1024
    port: int = 8000
    shared_metadata: Sequence[str] = ()
    """The sample's metadata keys the program sees in ``sample.json`` (none by default: metadata
    may hold what grades it)."""
    sandbox: CommandSandboxLike | None = None

    def agent_files(self, sample: Sample) -> dict[str, str | bytes]:
        """What the work directory starts with: ``files`` (read from the host) and ``sample.json``."""
        out: dict[str, str | bytes] = {}
        for name, host in dict(self.files).items():
            try:
                out[name] = Path(host).read_bytes()
            except OSError as exc:
                raise AgentError(f"{type(self).__name__}: cannot read files[{name!r}]: {exc}") from exc
        metadata = {k: sample.metadata[k] for k in self.shared_metadata if k in sample.metadata}
        opening = {"messages": self.get_initial_prompt(sample), "metadata": _jsonable(metadata)}
        out[SAMPLE_FILE] = json.dumps(opening, ensure_ascii=False)
        return out

    async def play(self, endpoint: AgentEndpoint, sample: Sample) -> CommandResultLike:
        """Run ``command`` in the sandbox against ``endpoint``; returns its result (``files``)."""
        if self.sandbox is None or endpoint.socket_path is None:
            raise AgentError(
                f"{type(self).__name__} runs its agent in a sandbox: give it one (the run builds it from "
                "the kwargs `provider: local`) and an endpoint on a Unix socket"
            )
        if not self.command:
            raise AgentError(f"{type(self).__name__} has no command: set kwargs.command (an argv list)")
        try:
            result = await self._run(endpoint, sample)
        except AgentError:
            raise
        except Exception as exc:  # the sandbox's own failure, not the agent's
            raise AgentError(f"the sandbox failed to run the agent: {type(exc).__name__}: {exc}") from exc
        if result.timed_out:
            raise AgentError(f"the agent did not finish within {float(self.agent_timeout_s):g} s")
        if result.exit_code != 0:
            killed = getattr(result, "killed_by", None)
            how = f" (stopped by its {killed} limit)" if killed and killed != "signal" else ""
            tail = result.stderr.strip()[-500:] or "(no stderr)"
            raise AgentError(f"the agent exited with status {result.exit_code}{how}: {tail}")
        return result

    async def _run(self, endpoint: AgentEndpoint, sample: Sample) -> CommandResultLike:
        assert self.sandbox is not None  # checked by play
        assert endpoint.socket_path is not None
        return await self.sandbox.run_command(
            [str(a) for a in self.command],
            timeout_s=float(self.agent_timeout_s),
            memory_mb=int(self.memory_mb),
            env={
                "OPENAI_BASE_URL": f"http://127.0.0.1:{self.port}{endpoint.path}",
                "OPENAI_API_KEY": endpoint.api_key,
                "OPENAI_MODEL": endpoint.model,
                # Anthropic's SDK adds /v1/messages itself
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{self.port}{endpoint.path.removesuffix('/v1')}",
                "ANTHROPIC_API_KEY": endpoint.api_key,
                "TELESCOPE_SAMPLE": SAMPLE_FILE,
            },
            files=self.agent_files(sample),
            files_out=[str(f) for f in self.files_out],
            forward_ports={int(self.port): endpoint.socket_path},
        )


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can carry it (what JSON cannot is written as text)."""
    return json.loads(json.dumps(value, default=str))
