"""Agents in the rollout engine (AgentEnvironment): each call of the agent is a model turn of its
sample, the trained tokens are the sampled ones, a rewritten history makes a further training
sequence, and a bad agent fails its sample with the reason. The agents use the real openai client
against the engine's gateway; the model is the fake server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from engine_fakes import make_engine

from telescope_rollout import AgentEnvironment, RolloutError, Sample
from telescope_rollout.envs import AgentEpisode
from telescope_rollout.gateway import AgentGateway
from telescope_rollout.testing import FakeInferenceServer, FakeRequest


class TwoCalls(AgentEnvironment):
    """Asks, answers a follow-up, returns the number in the last answer as its reward. ``rewrite``:
    the second call drops the first answer (a history the agent rewrote)."""

    rewrite = False
    max_calls = 8

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample(f"What is {i} + 1?", str(i + 1)) for i in range(4)], num_samples)

    async def run(self, client: Any, sample: Sample) -> Any:
        messages: list[Any] = [{"role": "user", "content": sample.prompt}]
        first = await client.chat.completions.create(model="m", messages=messages)
        if not self.rewrite:
            messages.append(first.choices[0].message.model_dump())
        messages.append({"role": "user", "content": "Are you sure?"})
        second = await client.chat.completions.create(model="m", messages=messages)
        return second.choices[0].message.content

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> float:
        return float(episode.result == episode.sample.answer) + len(episode.calls) / 100


def _replies(tokenizer):
    """The fake model answers '<n>' where n is the number of requests so far, as token ids + EOS."""
    sampled: dict[str, list[int]] = {}

    def reply(req: FakeRequest) -> tuple[str, list[int]]:
        text = str(len(sampled) % 3)
        ids = [*tokenizer.encode(text), tokenizer.eos_token_id]
        sampled[req.request_id] = ids
        return text, ids

    return reply, sampled


async def _one_batch(tokenizer, env, server=None, **settings):
    reply, sampled = _replies(tokenizer)
    server = server or FakeInferenceServer(reply=reply)
    engine = make_engine(tokenizer, server, env=env, **settings)
    engine.environments = {"echo": env}
    async with engine:
        batch = await engine.next_batch(timeout_s=60)
    return batch, server, sampled


async def test_an_agents_calls_are_one_sample_trained_on_the_sampled_tokens(tokenizer):
    batch, server, sampled = await _one_batch(tokenizer, TwoCalls(), max_tokens=8)
    (group,) = batch.groups
    for s in group.samples:
        assert s.error is None, s.error_detail
        assert s.num_turns == 2
        assert [t.role for t in s.turns] == ["model", "env", "model"]
        ids = [sampled[f"sample-{s.sample_id}-turn-{k}"] for k in (0, 1)]
        assert [i for i, m in zip(s.completion_ids, s.completion_mask, strict=True) if m] == [
            *ids[0],
            *ids[1],
        ]
        # what the server was sent: the first prompt, then the first prompt + sampled ids + context
        first, second = (
            r.prompt for r in server.requests if r.request_id.startswith(f"sample-{s.sample_id}-")
        )
        assert s.prompt_ids == first
        assert second == [*s.prompt_ids, *s.completion_ids[: len(second) - len(first)]]
        assert s.extra_sequences == []
        assert [t.segment for t in s.turns] == [0, 0, 0]
        assert s.reward in (0.02, 1.02)
        assert s.finish_reason == "agent_done"
    assert {r.max_tokens for r in server.requests} == {8}


async def test_an_agent_that_rewrites_its_history_makes_a_second_sequence_with_the_reason(tokenizer):
    batch, _, sampled = await _one_batch(tokenizer, TwoCalls(rewrite=True))
    s = batch.groups[0].samples[0]
    assert s.error is None, s.error_detail
    (extra,) = s.extra_sequences
    assert extra.reason == "assistant_edited@1"
    assert [t.segment for t in s.turns] == [0, 1]  # the second call began the second sequence
    assert [i for i, m in zip(extra.completion_ids, extra.completion_mask, strict=True) if m] == sampled[
        f"sample-{s.sample_id}-turn-1"
    ]
    assert s.num_model_tokens == len(sampled[f"sample-{s.sample_id}-turn-0"]) + len(
        sampled[f"sample-{s.sample_id}-turn-1"]
    )


class Raises(TwoCalls):
    async def run(self, client: Any, sample: Sample) -> Any:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        raise ValueError("the agent's bug")


class Silent(TwoCalls):
    async def run(self, client: Any, sample: Sample) -> Any:
        return 1.0


class Hangs(TwoCalls):
    agent_timeout_s = 0.3

    async def run(self, client: Any, sample: Sample) -> Any:
        await asyncio.sleep(60)


class Refused(TwoCalls):
    async def run(self, client: Any, sample: Sample) -> Any:
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=3)
        except Exception:
            return 0.0


@pytest.mark.parametrize(
    ("env", "kind", "detail"),
    [
        (Raises(), "rollout_error", "the agent raised ValueError: the agent's bug"),
        (Silent(), "empty_trajectory", "the agent made no model call"),
        (Hangs(), "rollout_error", "the agent did not finish within 0.3 s"),
        (Refused(), "empty_trajectory", "its last call was refused: n must be 1"),
    ],
)
async def test_a_bad_agent_fails_its_sample_with_the_reason_and_the_run_stops_once_every_group_does(
    tokenizer, env, kind, detail, monkeypatch
):
    opened: list[str] = []
    closed: list[str] = []
    open_episode, close_episode = AgentGateway.open_episode, AgentGateway.close_episode

    def opening(self: AgentGateway, *args: Any) -> Any:
        episode = open_episode(self, *args)
        opened.append(episode.id)
        return episode

    def closing(self: AgentGateway, episode: Any) -> None:
        closed.append(episode.id)
        close_episode(self, episode)

    monkeypatch.setattr(AgentGateway, "open_episode", opening)
    monkeypatch.setattr(AgentGateway, "close_episode", closing)
    reply, _ = _replies(tokenizer)
    engine = make_engine(tokenizer, FakeInferenceServer(reply=reply), env=env)
    engine.environments = {"echo": env}
    async with engine:
        with pytest.raises(RolloutError) as info:
            await engine.next_batch(timeout_s=60)
    assert kind in str(info.value)
    assert detail in str(info.value)
    # every episode was closed by its own sample, also those cancelled when the engine stopped
    assert len(opened) >= 8
    assert sorted(closed) == sorted(opened)
    assert engine.gateway is None  # the gateway stops with the engine


ADD = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}},
}


class ToolUser(TwoCalls):
    """Asks with an ``add`` tool, runs each call the model made and sends the results back."""

    async def run(self, client: Any, sample: Sample) -> Any:
        messages: list[Any] = [{"role": "user", "content": sample.prompt}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
        message = first.choices[0].message
        messages.append(message.model_dump())
        for call in message.tool_calls or []:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        second = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
        return second.choices[0].message.content


async def test_an_agents_tool_calls_are_recorded_with_their_results(qwen_tokenizer):
    calls = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><tool_call>{oops</tool_call>'
    )

    def reply(req: FakeRequest) -> tuple[str, list[int]]:
        text = calls if req.request_id.endswith("-turn-0") else "3"
        return text, [*qwen_tokenizer.encode(text), qwen_tokenizer.eos_token_id]

    engine = make_engine(
        qwen_tokenizer,
        FakeInferenceServer(reply=reply),
        env=ToolUser(),
        max_tokens=64,
        max_model_len=2048,
        discard_group_zero_advantage=False,
    )
    engine.environments = {"echo": engine.environments["echo"]}
    async with engine:
        batch = await engine.next_batch(timeout_s=60)
    s = batch.groups[0].samples[0]
    assert s.error is None, s.error_detail
    assert [t.segment for t in s.turns] == [0, 0, 0]
    assert [t.turn_type for t in s.turns] == ["generation", "tool_result", "generation"]
    good, bad = s.tool_calls
    assert (good["generation_idx"], good["call_id"], good["tool_name"]) == (0, "call_0_0", "add")
    assert json.loads(good["arguments"]) == {"a": 1, "b": 2}
    assert (good["result"], good["success"], good["error"]) == ("3", True, None)
    assert good["duration_s"] >= 0
    assert (bad["call_id"], bad["success"]) == ("", False)
    assert "invalid JSON" in bad["error"]


async def test_tools_for_a_template_that_never_shows_them_are_refused(tokenizer):
    env = ToolUser()
    engine = make_engine(tokenizer, FakeInferenceServer(), env=env)
    async with engine:
        with pytest.raises(RolloutError, match="chat template does not read `tools`"):
            await engine.next_batch(timeout_s=60)
