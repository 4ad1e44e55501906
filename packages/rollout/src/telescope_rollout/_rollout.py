"""One sample's rollout: generate (one or many turns), then score (spec §1.3, §11).

The engine owns lanes and weight versions; these functions own the protocol with the server and
the environment. ``on_generated`` is called once generation is over and before the reward, so
the engine can free the lane while a slow reward runs. Failures raise :class:`SampleError`
carrying the error kind the group-acceptance rules use; :func:`play_sample` (the engine's and the
eval runner's entry point) records them on the sample instead. Request ids are
``<request_prefix>-<sample_id>[-turn-<k>]`` (``sample`` for training, ``eval-...`` for evals).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from telescope_rollout._client import (
    Completion,
    InferenceError,
    PromptTooLongError,
    ServerTimeoutError,
    ServerUnavailableError,
)
from telescope_rollout._env import MultiTurnEnvironment
from telescope_rollout._multiturn import MultiTurnTokens
from telescope_rollout._prompts import PreparedPrompt, PromptSource
from telescope_rollout._results import ScoredSample
from telescope_rollout._settings import EngineSettings
from telescope_rollout._types import RewardResult, TrajectoryStep


class CompletionClient(Protocol):
    """What the engine needs from a client (``InferenceClient`` or a test double)."""

    server_urls: list[str]

    async def complete(
        self,
        url: str,
        prompt: list[int] | str,
        *,
        max_tokens: int,
        sampling: dict[str, Any] | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> Completion: ...


class SampleError(Exception):
    """A sample failed; ``kind`` is prompt_too_long, rollout_error, sample_error or empty_trajectory."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


TRUNCATED = ("length", "context_exhausted")


def completion_budget(settings: EngineSettings, prompt_len: int) -> int:
    """``max_tokens`` shortened so that prompt + completion fit in ``max_model_len``; <= 0 means none."""
    return min(settings.max_tokens, settings.max_model_len - prompt_len)


def _too_long(n: int, settings: EngineSettings) -> str:
    return f"{n} prompt tokens leave no room below max_model_len {settings.max_model_len}"


def apply_reward(out: ScoredSample, result: RewardResult) -> None:
    out.reward = float(result.total_reward)
    out.metrics = dict(result.sample_metrics)
    out.golden_answers = dict(result.golden_answers)
    out.info_turns = list(result.info_turns)
    out.sample_tags = dict(result.sample_tags)


async def run_single_turn(
    env: Any,
    prompt: PreparedPrompt,
    out: ScoredSample,
    *,
    client: CompletionClient,
    settings: EngineSettings,
    eos_token: str,
    on_generated: Callable[[], None],
    request_prefix: str = "sample",
) -> None:
    budget = completion_budget(settings, len(prompt.ids))
    if budget <= 0:
        raise SampleError("prompt_too_long", _too_long(len(prompt.ids), settings))
    try:
        comp = await client.complete(
            out.server, prompt.ids, max_tokens=budget, sampling=settings.sampling_params(),
            request_id=f"{request_prefix}-{out.sample_id}",
        )  # fmt: skip
    except PromptTooLongError as exc:
        raise SampleError("prompt_too_long", str(exc)) from exc
    out.completion_ids = comp.token_ids
    out.completion_mask = [1] * len(comp.token_ids)
    out.completion_logprobs = comp.logprobs
    out.completion_text = comp.text
    out.finish_reason = comp.finish_reason
    out.is_truncated = comp.finish_reason in TRUNCATED
    out.num_turns = 1
    on_generated()
    try:
        result = await env.score(comp.text, prompt.sample, eos_token)
    except Exception as exc:
        raise SampleError("sample_error", f"compute_reward raised {type(exc).__name__}: {exc}") from exc
    apply_reward(out, result)


async def run_multi_turn(
    env: MultiTurnEnvironment,
    prompt: PreparedPrompt,
    out: ScoredSample,
    *,
    client: CompletionClient,
    settings: EngineSettings,
    prompts: PromptSource,
    eos_token: str,
    on_generated: Callable[[], None],
    request_prefix: str = "sample",
) -> None:
    """Interleaved multi-turn: later turns send ids (previous prompt + model ids + env ids)."""
    assert prompt.messages is not None
    # the environment's own template variables (e.g. native ``tools``) on every render of the episode
    mt = MultiTurnTokens(prompts.turn_tokenizer.for_kwargs(env.template_kwargs()), prompt.messages)
    state = env.create_initial_state(prompt.sample)
    stop_reason: str | None = None
    turn = 0
    while True:
        ids = mt.trajectory.next_prompt_ids
        budget = completion_budget(settings, len(ids))
        if budget <= 0:
            if turn == 0:
                raise SampleError("prompt_too_long", _too_long(len(ids), settings))
            stop_reason = "context_exhausted"
            break
        priority = -turn if settings.scheduling_policy == "priority" else 0
        try:
            comp = await client.complete(
                out.server, ids, max_tokens=budget, sampling=settings.sampling_params(), priority=priority,
                request_id=f"{request_prefix}-{out.sample_id}-turn-{turn}",
            )  # fmt: skip
        except PromptTooLongError as exc:
            if turn == 0:
                raise SampleError("prompt_too_long", str(exc)) from exc
            stop_reason = "context_exhausted"
            break
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
        try:
            reply, done, reason = await env.step(list(mt.messages), state)
        except Exception as exc:
            raise SampleError("rollout_error", f"env_response raised {type(exc).__name__}: {exc}") from exc
        if done:
            stop_reason = reason
            break
        mt.add_env_turn(reply)
    if state.num_turns == 0:
        raise SampleError("empty_trajectory", "no model turn")
    if not state.is_completed:
        state.is_completed = True
        state.stop_reason = stop_reason
    traj = mt.trajectory
    out.completion_ids = traj.completion_ids
    out.completion_mask = traj.completion_mask
    out.completion_logprobs = traj.completion_logprobs
    out.completion_text = prompts.tokenizer.decode(traj.completion_ids)
    out.finish_reason = state.stop_reason
    out.is_truncated = state.stop_reason == "context_exhausted"
    out.num_turns = state.num_turns
    out.tool_calls = list(state.custom.get("tool_calls", []))
    on_generated()
    try:
        result = await env.score(state, eos_token)
    except Exception as exc:
        raise SampleError("sample_error", f"compute_reward raised {type(exc).__name__}: {exc}") from exc
    apply_reward(out, result)


def sample_error(exc: Exception) -> tuple[str, str]:
    """``(error kind, detail)`` recorded on a sample whose rollout raised ``exc``."""
    if isinstance(exc, SampleError):
        return exc.kind, exc.detail
    if isinstance(exc, ServerUnavailableError):
        return "rollout_error", str(exc)
    return "rollout_error", f"{type(exc).__name__}: {exc}"


async def play_sample(
    env: Any,
    prompt: PreparedPrompt,
    out: ScoredSample,
    *,
    prompts: PromptSource,
    **kwargs: Any,
) -> InferenceError | None:
    """Generate and score one sample (one turn or the whole episode) into ``out``.

    A failure is recorded as ``out.error``/``out.error_detail`` (:func:`sample_error`), never
    raised; cancellation propagates. Returns the server's own failure, so the caller can decide to
    stop sending to it: the :class:`ServerUnavailableError` when it could not be reached, the
    :class:`ServerTimeoutError` when it gave no answer in time; otherwise None. ``kwargs`` go to
    :func:`run_single_turn` / :func:`run_multi_turn`.
    """
    try:
        if env.is_multi_turn:
            await run_multi_turn(env, prompt, out, prompts=prompts, **kwargs)
        else:
            await run_single_turn(env, prompt, out, **kwargs)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        out.error, out.error_detail = sample_error(exc)
        if isinstance(exc, ServerUnavailableError | ServerTimeoutError):
            return exc
    return None
