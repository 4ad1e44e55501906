"""One sample's rollout: generate (one or many turns), then score.

The engine owns lanes and weight versions; these functions own the protocol with the server and
the environment. ``on_generated`` is called once generation is over and before the reward, so
the engine can free the lane while a slow reward runs. Failures raise :class:`SampleError`
carrying the error kind the group-acceptance rules use; :func:`play_sample` (the engine's and the
eval runner's entry point) records them on the sample instead. Request ids are
``<request_prefix>-<sample_id>[-turn-<k>]`` (``sample`` for training, ``eval-...`` for evals).

Every completed model turn and environment response is appended to ``out.turns`` as it ends
(a :class:`Turn`), so a sample cancelled midway keeps what it did; ``play_sample`` also stamps
the sample's wall-clock times (docs/rollout.md, "What a sample records").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from telescope_rollout._types import Message, RewardResult, RolloutState, TrajectoryStep
from telescope_rollout.chat._multiturn import MultiTurnTokens
from telescope_rollout.engine._prompts import PreparedPrompt, PromptSource
from telescope_rollout.engine._results import ScoredSample, Turn
from telescope_rollout.engine._settings import EngineSettings
from telescope_rollout.engine._tokens import TokenArray
from telescope_rollout.envs._env import MultiTurnEnvironment
from telescope_rollout.gateway import AgentGateway
from telescope_rollout.inference._client import (
    Completion,
    CompletionClient,
    InferenceError,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
    cache_salt,
)


class SampleError(Exception):
    """A sample failed; ``kind`` is prompt_too_long, rollout_error, sample_error or empty_trajectory."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


TRUNCATED = ("length", "context_exhausted")


def _nothing() -> None:
    return None


def _no_version() -> int:
    return -1


def completion_budget(settings: EngineSettings, prompt_len: int) -> int:
    """``max_tokens`` shortened so that prompt + completion fit in ``max_model_len``; <= 0 means none."""
    return min(settings.max_tokens, settings.max_model_len - prompt_len)


def too_long(n: int, settings: EngineSettings) -> str:
    """The error detail of a prompt of ``n`` tokens that leaves no room for a completion."""
    return f"{n} prompt tokens leave no room below max_model_len {settings.max_model_len}"


def apply_reward(out: ScoredSample, result: RewardResult) -> None:
    out.reward = float(result.total_reward)
    out.metrics = dict(result.sample_metrics)
    out.golden_answers = dict(result.golden_answers)
    out.info_turns = list(result.info_turns)
    out.sample_tags = dict(result.sample_tags)


async def _generate(
    client: CompletionClient,
    out: ScoredSample,
    ids: list[int],
    settings: EngineSettings,
    *,
    request_id: str,
    priority: int = 0,
    first_turn: bool = True,
    salt: str = "",
    max_tokens: int | None = None,
) -> Completion | None:
    """One completion of ``ids`` on the sample's server, ``max_tokens`` (the settings', or the
    smaller ``max_tokens`` given) shortened to the room left, with prefix-cache salt ``salt``.

    When there is no room (by our count, or by the server's ``PromptTooLongError``) the first turn
    fails with ``prompt_too_long``; a later turn returns None: the episode's context is exhausted.
    """
    budget = min(completion_budget(settings, len(ids)), max_tokens or settings.max_tokens)
    if budget <= 0:
        if first_turn:
            raise SampleError("prompt_too_long", too_long(len(ids), settings))
        return None
    try:
        return await client.complete(
            out.server,
            ids,
            max_tokens=budget,
            sampling=settings.sampling_params(),
            priority=priority,
            request_id=request_id,
            cache_salt=salt,
        )
    except PromptTooLongError as exc:
        if first_turn:
            raise SampleError("prompt_too_long", str(exc)) from exc
        return None


async def score_into(out: ScoredSample, scoring: Awaitable[RewardResult]) -> None:
    """Await the environment's score into ``out``; a raising reward function is a ``sample_error``.

    Stamps ``out.reward_start`` / ``out.reward_end`` (wall clock) around it."""
    out.reward_start = time.time()
    try:
        result = await scoring
    except Exception as exc:
        raise SampleError("sample_error", f"compute_reward raised {type(exc).__name__}: {exc}") from exc
    finally:
        out.reward_end = time.time()
    apply_reward(out, result)


@dataclass(frozen=True)
class Play:
    """How a sample is played: the client and settings to generate with, the prompt source (its
    tokenizers), the end-of-sequence text reward functions strip, ``on_generated`` (called once
    generation is over, before the reward), the request-id prefix, ``version()``: the weight
    version live on the sample's server now (recorded on each model turn; evals: -1), and
    ``weights()``: the weight version the server holds for the prefix-cache salt of each request
    (None: ``version()``; evals give the evaluated step)."""

    client: CompletionClient
    settings: EngineSettings
    prompts: PromptSource
    eos_token: str
    on_generated: Callable[[], None] = _nothing
    request_prefix: str = "sample"
    version: Callable[[], int] = _no_version
    weights: Callable[[], int] | None = None
    gateway: Callable[[], Awaitable[AgentGateway]] | None = None
    """The started agent gateway (agent environments' episodes are served there); None: no agents."""

    def cache_salt(self) -> str:
        """The prefix-cache salt of a request sent now: :func:`cache_salt` of the server's weights."""
        return cache_salt((self.weights or self.version)())


async def model_turn(
    out: ScoredSample,
    ids: list[int],
    play: Play,
    *,
    request_id: str,
    priority: int = 0,
    first_turn: bool = True,
    max_tokens: int | None = None,
) -> Completion | None:
    """:func:`_generate` on the sample's server, recorded as a model :class:`Turn` on ``out.turns``
    when it answers (None: the context is exhausted, no turn)."""
    start, version_start, t0 = time.time(), play.version(), time.perf_counter()
    comp = await _generate(
        play.client,
        out,
        ids,
        play.settings,
        request_id=request_id,
        priority=priority,
        first_turn=first_turn,
        salt=play.cache_salt(),
        max_tokens=max_tokens,
    )
    if comp is None:
        return None
    timings = dict(comp.timings)
    timings.setdefault("e2e_s", time.perf_counter() - t0)  # a client that did not measure it
    out.turns.append(
        Turn(
            index=len(out.turns),
            role="model",
            turn_type="generation",
            text=comp.text,
            tokens=len(comp.token_ids),
            prompt_tokens=len(ids),
            stop_reason=comp.finish_reason,
            server=out.server,
            version_start=version_start,
            version_end=play.version(),
            start=start,
            end=time.time(),
            request_id=request_id,
            timings=timings,
        )
    )
    return comp


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string as is, the ``text`` of OpenAI-style parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p) for p in cast(list[object], content))
    return str(content)


def _part_text(part: object) -> str:
    """One OpenAI-style content part as text: a part's ``text``, anything else as ``str``."""
    return str(cast(dict[str, Any], part).get("text", "")) if isinstance(part, dict) else str(part)


def system_prompt_of(env: Any, prompt: PreparedPrompt) -> str:
    """The content of the prompt's first system message ("" without one).

    Multi-turn prompts carry their messages; a single-turn prompt's are rebuilt with the
    environment's ``build_messages`` (what ``format_prompt`` rendered)."""
    messages: list[Message] | None = prompt.messages
    if messages is None:
        build: Any = getattr(env, "build_messages", None)
        messages = list(build(prompt.sample.prompt)) if build is not None else []
    for m in messages:
        if isinstance(cast(object, m), dict) and m.get("role") == "system":  # built by the env
            return content_text(m.get("content"))
    return ""


def env_turn(out: ScoredSample, reply: list[Message], tokens: int, start: float, end: float) -> Turn:
    """The environment :class:`Turn` of one ``env.step`` that returned ``reply``."""
    first = reply[0] if reply else {}
    return Turn(
        index=len(out.turns),
        role="env",
        turn_type=str(first.get("turn_type") or "env_response"),
        text="\n\n".join(content_text(m.get("content")) for m in reply),
        tokens=tokens,
        start=start,
        end=end,
    )


async def _step_env(
    env: MultiTurnEnvironment, mt: MultiTurnTokens, state: RolloutState, out: ScoredSample
) -> tuple[bool, str | None]:
    """One environment turn: ``env.step``, then (unless done) its reply into the token stream.

    Records an environment :class:`Turn` when the reply is not empty or went into the tokens,
    and copies the tool-call records so far onto ``out``. Returns ``(done, reason)``.
    """
    start = time.time()
    try:
        reply, done, reason = await env.step(list(mt.messages), state)
    except Exception as exc:
        raise SampleError("rollout_error", f"env_response raised {type(exc).__name__}: {exc}") from exc
    end = time.time()
    out.tool_calls = list(state.custom.get("tool_calls", []))
    tokens = -1
    if not done:
        before = len(mt.trajectory.completion_ids)
        mt.add_env_turn(reply)
        tokens = len(mt.trajectory.completion_ids) - before
    if reply or not done:
        out.turns.append(env_turn(out, reply, tokens, start, end))
    return done, reason


def record_completion(
    out: ScoredSample, ids: Sequence[int], mask: Sequence[int] | None, logprobs: Sequence[float], text: str
) -> None:
    """The finished completion into ``out``, its per-token values as :class:`TokenArray` s (``mask``
    None: every token the model's)."""
    out.completion_ids = TokenArray.ids(ids)
    out.completion_mask = TokenArray.ones(len(ids)) if mask is None else TokenArray.mask(mask)
    out.completion_logprobs = TokenArray.logprobs(logprobs)
    out.completion_text = text


async def run_single_turn(env: Any, prompt: PreparedPrompt, out: ScoredSample, play: Play) -> None:
    request_id = f"{play.request_prefix}-{out.sample_id}"
    comp = await model_turn(out, prompt.ids, play, request_id=request_id)
    assert comp is not None  # the first turn raises instead
    record_completion(out, comp.token_ids, None, comp.logprobs, comp.text)
    out.finish_reason = comp.finish_reason
    out.is_truncated = comp.finish_reason in TRUNCATED
    out.num_turns = 1
    play.on_generated()
    await score_into(out, env.score(comp.text, prompt.sample, play.eos_token))


async def _play_turns(
    env: MultiTurnEnvironment, mt: MultiTurnTokens, state: RolloutState, out: ScoredSample, play: Play
) -> str | None:
    """Model turn, environment turn, ... until the environment is done or the context is full.

    Returns the stop reason; ``state.trajectory`` gets one step per model turn. Under vLLM's
    priority scheduling turn k is sent with priority -k, so episodes further along finish first.
    """
    turn = 0
    while True:
        ids = mt.trajectory.next_prompt_ids
        priority = -turn if play.settings.scheduling_policy == "priority" else 0
        request_id = f"{play.request_prefix}-{out.sample_id}-turn-{turn}"
        comp = await model_turn(
            out, ids, play, request_id=request_id, priority=priority, first_turn=turn == 0
        )
        if comp is None:
            return "context_exhausted"
        before = list(mt.messages)
        mt.add_model_turn(comp.token_ids, comp.logprobs, comp.text)
        state.trajectory.append(
            TrajectoryStep(
                prompt=before,
                completion=[mt.messages[-1]],
                prompt_token_ids=ids,
                completion_token_ids=list(comp.token_ids),
                completion_logprobs=list(comp.logprobs),
                is_truncated=comp.finish_reason == "length",
            )
        )
        turn += 1
        done, reason = await _step_env(env, mt, state, out)
        if done:
            return reason


async def run_multi_turn(
    env: MultiTurnEnvironment, prompt: PreparedPrompt, out: ScoredSample, play: Play
) -> None:
    """Interleaved multi-turn: later turns send ids (previous prompt + model ids + env ids); see
    docs/rollout.md, "Multi-turn tokens"."""
    assert prompt.messages is not None
    # the environment's own template variables (e.g. native ``tools``) on every render of the episode
    mt = MultiTurnTokens(play.prompts.turn_tokenizer.for_kwargs(env.template_kwargs()), prompt.messages)
    state = env.create_initial_state(prompt.sample)
    stop_reason = await _play_turns(env, mt, state, out, play)
    if state.num_turns == 0:
        raise SampleError("empty_trajectory", "no model turn")
    if not state.is_completed:
        state.is_completed = True
        state.stop_reason = stop_reason
    traj = mt.trajectory
    text = play.prompts.tokenizer.decode(traj.completion_ids)
    record_completion(out, traj.completion_ids, traj.completion_mask, traj.completion_logprobs, text)
    out.finish_reason = state.stop_reason
    out.is_truncated = state.stop_reason == "context_exhausted"
    out.num_turns = state.num_turns
    out.tool_calls = list(state.custom.get("tool_calls", []))
    play.on_generated()
    await score_into(out, env.score(state, play.eos_token))


def sample_error(exc: Exception) -> tuple[str, str]:
    """``(error kind, detail)`` recorded on a sample whose rollout raised ``exc``."""
    if isinstance(exc, SampleError):
        return exc.kind, exc.detail
    if isinstance(exc, ServerUnavailableError):
        return "rollout_error", str(exc)
    return "rollout_error", f"{type(exc).__name__}: {exc}"


async def play_sample(
    env: Any, prompt: PreparedPrompt, out: ScoredSample, play: Play
) -> InferenceError | None:
    """Generate and score one sample (one turn or the whole episode) into ``out``.

    A failure is recorded as ``out.error``/``out.error_detail`` (:func:`sample_error`), never
    raised; cancellation propagates. Returns the server's own failure, so the caller can decide to
    stop sending to it: the :class:`ServerUnavailableError` when it could not be reached, the
    :class:`ServerTimeoutError` when it gave no answer in time; otherwise None.

    Also fills ``out.sample_index``, ``out.system_prompt`` and ``out.dispatched_at`` (when the
    caller did not) and ``out.finished_at`` (the reward's end, else when it stopped; a time the
    caller set on cancelling stays).
    """
    out.sample_index = prompt.index
    out.system_prompt = out.system_prompt or system_prompt_of(env, prompt)
    out.dispatched_at = out.dispatched_at or time.time()
    try:
        if env.kind == "agent":  # an AgentEnvironment (evals wrap environments: the kind is forwarded)
            from telescope_rollout.engine._agent import run_agent_episode

            await run_agent_episode(env, prompt, out, play)
        elif env.is_multi_turn:
            await run_multi_turn(env, prompt, out, play)
        else:
            await run_single_turn(env, prompt, out, play)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        out.error, out.error_detail = sample_error(exc)
        if isinstance(exc, ServerUnavailableError | ServerTimeoutError):
            return exc
    finally:
        out.finished_at = out.finished_at or out.reward_end or time.time()
    return None
