"""One agent episode (``envs.AgentEnvironment``), played through the agent gateway.

The episode gets its own base URL and key on the gateway (docs/rollout.md, "Agents"); the
environment's ``play`` runs the agent against it. Each call the agent makes is generated on the
sample's server like any model turn (``model_turn``: the run's sampling settings, its weight
version, timings and request id ``<prefix>-<sample id>-turn-<k>``, priority ``-k``), and the new
messages it brought (tool results, a user turn) are the environment's turn before it. When the
agent returns, the episode is closed (later calls get 401), its first training sequence fills the
sample and any further ones (an agent that rewrote its history) go to
``ScoredSample.extra_sequences`` with their reasons; then the environment scores the
``AgentEpisode``.

An environment whose agent runs in a sandbox (``forwards_ports``) has its episode served on a Unix
socket of its own, which the sandbox relays into the agent's network namespace.

Failures are the sample's, with the reason: an agent that raises or exits badly, or runs past
``agent_timeout_s``, is a ``rollout_error`` ("the agent raised ...", "the agent exited with status
...", "the agent did not finish within ..."); an agent that made no answered call is an
``empty_trajectory`` (with the last refusal, if its calls were refused); a server that failed
under a call is returned to the engine as that failure, as for any sample.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any

from telescope_rollout._types import Message
from telescope_rollout.engine._episode import (
    Play,
    SampleError,
    env_turn,
    model_turn,
    record_completion,
    score_into,
)
from telescope_rollout.engine._prompts import PreparedPrompt
from telescope_rollout.engine._results import ScoredSample, TrainingSequence
from telescope_rollout.envs._agent import AgentEndpoint, AgentEnvironment, AgentEpisode, AgentError
from telescope_rollout.gateway import CallPlan, Episode, GatewayLimits, Generate
from telescope_rollout.inference._client import Completion, PromptTooLongError

__all__ = ["run_agent_episode"]


async def run_agent_episode(
    env: AgentEnvironment, prompt: PreparedPrompt, out: ScoredSample, play: Play
) -> None:
    """Run the agent of ``env`` on ``prompt``'s sample into ``out`` (module docstring)."""
    if play.gateway is None:
        raise SampleError("rollout_error", "this engine has no agent gateway (it was built without agents)")
    gateway = await play.gateway()
    limits = GatewayLimits(
        max_model_len=play.settings.max_model_len,
        max_tokens=play.settings.max_tokens,
        max_calls=int(env.max_calls),
        tool_call_format=str(env.tool_call_format),
    )
    episode = gateway.open_episode(
        play.prompts.turn_tokenizer.for_kwargs(env.template_kwargs()), _generator(out, play), limits
    )
    try:
        socket_path = await gateway.listen_unix(episode) if env.forwards_ports else None
        endpoint = AgentEndpoint(episode.base_url, episode.api_key, gateway.model, socket_path)
        result = await _play(env, endpoint, prompt, episode)
    finally:
        gateway.close_episode(episode)
    failed = _episode_failure(episode)
    if failed is not None:
        raise failed
    if not episode.calls:
        refused = f"; its last call was refused: {episode.refused[-1]}" if episode.refused else ""
        raise SampleError("empty_trajectory", f"the agent made no model call{refused}")
    _record_sequences(out, episode, play)
    play.on_generated()
    calls = [
        {"message": c.message, "finish_reason": c.finish_reason, "segment": c.segment, "split": c.split}
        for c in episode.calls
    ]
    last = episode.tokens.segments[-1].tokens.messages
    stop = out.finish_reason or "agent_done"
    scored = AgentEpisode(prompt.sample, result, calls, list(last), len(episode.tokens.segments), stop)
    await score_into(out, env.score(scored, play.eos_token))


async def _play(
    env: AgentEnvironment, endpoint: AgentEndpoint, prompt: PreparedPrompt, episode: Episode
) -> Any:
    """``env.play`` within ``agent_timeout_s``; what goes wrong is a ``rollout_error`` with the reason
    (a server failure under one of its calls is left to the caller)."""
    timeout_s = float(env.agent_timeout_s)
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await env.play(endpoint, prompt.sample)
    except TimeoutError as exc:
        if deadline.expired():
            raise SampleError("rollout_error", f"the agent did not finish within {timeout_s:g} s") from exc
        raise _agent_error(exc, episode) from exc
    except Exception as exc:
        raise _agent_error(exc, episode) from exc


def _episode_failure(episode: Episode) -> Exception | None:
    """What failed under one of the episode's calls: its server, or the gateway itself (a bug)."""
    if episode.failure is not None:
        return episode.failure
    return SampleError("rollout_error", episode.error) if episode.error else None


def _agent_error(exc: Exception, episode: Episode) -> Exception:
    """The sample's error for an agent that raised ``exc``: what failed under its call (not the
    agent's reaction to it), else the agent's own exception."""
    own = str(exc) if isinstance(exc, AgentError) else f"the agent raised {type(exc).__name__}: {exc}"
    return _episode_failure(episode) or SampleError("rollout_error", own[:2000])


def _generator(out: ScoredSample, play: Play) -> Generate:
    """The gateway's ``generate`` for this sample: the new messages as the environment's turn, then
    a model turn of the planned prompt."""
    calls = 0
    last_end = time.time()

    async def generate(plan: CallPlan, budget: int) -> Completion:
        nonlocal calls, last_end
        turns = len(out.turns)
        if plan.tail or plan.context_ids:  # what the agent brought since its last call
            reply = plan.tail or [{"role": "user", "content": plan.context_text}]  # /completions: its text
            turn = env_turn(out, reply, len(plan.context_ids), last_end, time.time())
            turn.turn_type = _tail_type(plan.tail) if plan.tail else "context"
            out.turns.append(turn)
        k, calls = calls, calls + 1
        comp = await _answered(
            out,
            turns,
            model_turn(
                out,
                plan.prompt_ids,
                play,
                request_id=f"{play.request_prefix}-{out.sample_id}-turn-{k}",
                priority=-k if play.settings.scheduling_policy == "priority" else 0,
                first_turn=False,
                max_tokens=budget,
            ),
        )
        last_end = time.time()
        if comp is None:
            raise PromptTooLongError(len(plan.prompt_ids), play.settings.max_model_len, out.server)
        for turn in out.turns[turns:]:
            turn.segment = plan.segment
        return comp

    return generate


def _tail_type(tail: list[Message]) -> str:
    """The record's turn type of the messages an agent brought: ``tool_result`` (tool messages only),
    ``env_response`` (a user message among them) or ``context`` (system or assistant messages)."""
    roles = {m["role"] for m in tail}
    return "tool_result" if roles == {"tool"} else "env_response" if "user" in roles else "context"


async def _answered(out: ScoredSample, turns: int, call: Awaitable[Completion | None]) -> Completion | None:
    """``call``'s completion; when it fails, the environment turn recorded for it goes too (the
    call's messages are in no sequence)."""
    try:
        comp = await call
    except BaseException:
        del out.turns[turns:]
        raise
    if comp is None:
        del out.turns[turns:]
    return comp


def _record_sequences(out: ScoredSample, episode: Episode, play: Play) -> None:
    """The first segment into the sample's own fields, the others into ``extra_sequences``."""
    first, *rest = episode.tokens.segments
    t = first.tokens.trajectory
    out.prompt_ids = list(t.prompt_ids)
    out.prompt_text = play.prompts.tokenizer.decode(t.prompt_ids)
    # copies: the episode's state is not the sample's
    ids, mask, logprobs = list(t.completion_ids), list(t.completion_mask), list(t.completion_logprobs)
    record_completion(out, ids, mask, logprobs, play.prompts.tokenizer.decode(ids))
    out.extra_sequences = [
        TrainingSequence(
            list(s.tokens.trajectory.prompt_ids),
            list(s.tokens.trajectory.completion_ids),
            list(s.tokens.trajectory.completion_mask),
            list(s.tokens.trajectory.completion_logprobs),
            s.reason,
        )
        for s in rest
    ]
    out.tool_calls = tool_call_records(episode)
    last = episode.calls[-1]
    out.num_turns = len(episode.calls)
    out.finish_reason = "length" if last.finish_reason == "length" else "agent_done"
    out.is_truncated = last.finish_reason == "length"


def tool_call_records(episode: Episode) -> list[dict[str, Any]]:
    """The tool calls the model made in ``episode``, as the record's ``tool_calls`` rows read them
    (``ToolEnvironment``'s keys, plus the OpenAI ``call_id``): each with its result and how long the
    agent took to send it back (a later call's ``tool`` message with that id), or the reason it has
    none (a malformed call, or no result sent)."""
    results: dict[str, tuple[str, float]] = {}  # call id -> its result, when the agent first sent it
    for call in episode.calls:
        for call_id, content in call.tool_results.items():
            results.setdefault(call_id, (content, call.start))
    records: list[dict[str, Any]] = []
    for call in episode.calls:
        returned: list[dict[str, Any]] = call.message.get("tool_calls") or []
        ids = iter(str(c["id"]) for c in returned)
        for parsed in call.tool_calls:
            call_id = next(ids, "") if parsed.name and not parsed.error else ""
            result = results.get(call_id) if call_id else None
            records.append(
                {
                    "generation_idx": call.index,
                    "tool_call_idx": len(records),
                    "call_id": call_id,
                    "tool_name": parsed.name,
                    "arguments": json.dumps(parsed.arguments, ensure_ascii=False),
                    "raw_text": parsed.raw,
                    "result": result[0] if result else None,
                    "success": result is not None,
                    "error": parsed.error or (None if result else "the agent sent back no result for it"),
                    "start": call.end,
                    "duration_s": result[1] - call.end if result else None,
                    "sandbox": "",
                }
            )
    return records
