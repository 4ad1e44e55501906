"""The agent gateway's OpenAI-compatible endpoint, driven by the real ``openai`` client: a
tool-using agent over a scripted model (what it 'samples' is fixed, so every id can be checked),
streaming, and the refusals a bad agent meets."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import aiohttp
import openai
import pytest

from telescope_rollout.chat import TurnTokenizer
from telescope_rollout.gateway import AgentGateway, CallPlan, GatewayLimits
from telescope_rollout.inference import Completion, ServerUnavailableError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
QUESTION = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 12 + 30?"}]


class Scripted:
    """A model that answers each call with the next text of its script (ids: the text's encoding and
    EOS, logprob -0.5 each); it records the prompts it was sent."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts = tokenizer, iter(texts)
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def __call__(self, plan: CallPlan, max_tokens: int) -> Completion:
        self.prompts.append(list(plan.prompt_ids))
        text = next(self.texts)
        out = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id][:max_tokens]
        self.sampled.append(out)
        return Completion(text=text, token_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop")


def _client(episode) -> Any:
    """The real client, typed Any: its request types are strict TypedDicts, the tests send plain dicts."""
    return openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)


LIMITS = GatewayLimits(max_model_len=2048, max_tokens=64)


async def test_a_tool_using_agent_trains_on_exactly_the_sampled_tokens(qwen_tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>'
    model = Scripted(qwen_tokenizer, [call, "The answer is 42."])
    async with AgentGateway(model="tiny") as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        async with _client(episode) as client:
            messages = list(QUESTION)
            first = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls"
            (tc,) = choice.message.tool_calls or []
            assert (tc.id, tc.function.name, json.loads(tc.function.arguments)) == (
                "call_0_0",
                "add",
                {"a": 12, "b": 30},
            )
            assert choice.message.content is None
            assert first.usage is not None
            assert first.usage.completion_tokens == len(model.sampled[0])
            # the agent runs the tool and sends the conversation back, as openai-python users do
            messages += [
                choice.message.model_dump(exclude_none=False),
                {"role": "tool", "tool_call_id": tc.id, "content": "42"},
            ]
            second = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
            assert second.choices[0].message.content == "The answer is 42."
            assert second.choices[0].finish_reason == "stop"
    (seg,) = episode.tokens.segments
    t = seg.tokens.trajectory
    assert [i for i, m in zip(t.completion_ids, t.completion_mask, strict=True) if m] == [
        *model.sampled[0],
        *model.sampled[1],
    ]
    assert [lp for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if m] == [-0.5] * sum(
        map(len, model.sampled)
    )
    # the second prompt is the first, the sampled ids, then context; and is what the sequence holds
    assert model.prompts[1][: len(model.prompts[0]) + len(model.sampled[0])] == [
        *model.prompts[0],
        *model.sampled[0],
    ]
    assert t.next_prompt_ids[: len(model.prompts[1])] == model.prompts[1]
    assert "<tool_response>\n42\n</tool_response>" in qwen_tokenizer.decode(
        model.prompts[1][len(model.prompts[0]) :]
    )
    assert '"name": "add"' in qwen_tokenizer.decode(model.prompts[0])  # the tools were rendered
    assert [c.segment for c in episode.calls] == [0, 0]
    assert episode.refused == []


async def _stream(client: Any, **kwargs: Any) -> list[Any]:
    stream = await client.chat.completions.create(model="any", stream=True, **kwargs)
    return [chunk async for chunk in stream]


async def test_streamed_answers_carry_the_same_content_and_tool_calls(qwen_tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    model = Scripted(qwen_tokenizer, ["Sure: 42", call])
    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        async with _client(episode) as client:
            chunks = await _stream(
                client, messages=QUESTION, tools=TOOLS, stream_options={"include_usage": True}
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "Sure: 42"
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == len(model.sampled[0])
            again = [
                *QUESTION,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "add 1 and 2"},
            ]
            chunks = await _stream(client, messages=again, tools=TOOLS)
            calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            assert [(tc.index, tc.id, tc.function.name) for tc in calls] == [(0, "call_1_0", "add")]
    # the streamed answer, sent back, extended the episode
    assert [(s.reason, s.calls) for s in episode.tokens.segments] == [("", 2)]


async def test_what_a_bad_agent_sends_is_refused_with_the_reason(qwen_tokenizer):
    model = Scripted(qwen_tokenizer, ["ok"] * 10)
    async with AgentGateway() as gateway:
        episode = gateway.open_episode(
            TurnTokenizer(qwen_tokenizer), model, GatewayLimits(max_model_len=64, max_tokens=8, max_calls=6)
        )
        other = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        async with _client(episode) as client:
            with pytest.raises(openai.BadRequestError, match="n must be 1"):
                await client.chat.completions.create(model="m", messages=QUESTION, n=2)
            with pytest.raises(openai.BadRequestError, match="tool_choice must be auto or none"):
                await client.chat.completions.create(
                    model="m", messages=QUESTION, tools=TOOLS, tool_choice="required"
                )
            with pytest.raises(openai.BadRequestError, match="logit_bias is not supported"):
                await client.chat.completions.create(model="m", messages=QUESTION, logit_bias={"1": 5})
            long = [{"role": "user", "content": "The quick brown fox " * 20}]
            with pytest.raises(
                openai.BadRequestError, match="leaves no room below the run's max_model_len 64"
            ) as info:
                await client.chat.completions.create(model="m", messages=long)
            assert info.value.code == "context_length_exceeded"
            assert model.prompts == []  # nothing refused reached the model
            await client.chat.completions.create(model="m", messages=QUESTION)
            await client.chat.completions.create(model="m", messages=QUESTION)
            # 4 refused and 2 answered: the 6 calls are made, refused ones included
            with pytest.raises(openai.BadRequestError, match=r"made its 6 calls \(4 of them refused\)"):
                await client.chat.completions.create(model="m", messages=QUESTION)
        # another episode's key does not open this one; an unknown episode is the same 401
        wrong: Any = openai.AsyncOpenAI(base_url=episode.base_url, api_key=other.api_key, max_retries=0)
        async with wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.chat.completions.create(model="m", messages=QUESTION)
        auth = {"Authorization": f"Bearer {episode.api_key}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.post(episode.base_url + "/chat/completions", data=b"{not json") as bad:
                assert bad.status == 400
                assert "not JSON" in (await bad.json())["error"]["message"]
            async with http.get(episode.base_url + "/models") as models:
                assert [m["id"] for m in (await models.json())["data"]] == ["telescope"]
            gateway.close_episode(episode)
            async with http.post(episode.base_url + "/chat/completions", json={"messages": QUESTION}) as late:
                assert late.status == 401  # gone: as if it never was
    assert len(episode.refused) == 6
    assert "n must be 1" in episode.refused[0]


async def test_a_failing_model_server_is_a_503_and_kept_for_the_engine(qwen_tokenizer):
    async def down(plan: CallPlan, max_tokens: int) -> Completion:
        raise ServerUnavailableError("http://a: connection refused")

    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), down, LIMITS)
        async with _client(episode) as client:
            with pytest.raises(openai.InternalServerError, match="the model server failed"):
                await client.chat.completions.create(model="m", messages=QUESTION)
    assert isinstance(episode.failure, ServerUnavailableError)
    assert episode.calls == []
    assert episode.tokens.segments == []


async def test_an_episode_closed_while_a_call_generates_cancels_it_and_records_nothing(qwen_tokenizer):
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(plan: CallPlan, max_tokens: int) -> Completion:
        entered.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not reached")

    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), slow, LIMITS)
        async with _client(episode) as client:
            call = asyncio.create_task(client.chat.completions.create(model="m", messages=QUESTION))
            await asyncio.wait_for(entered.wait(), 10)
            gateway.close_episode(episode)  # the agent's time ran out
            await asyncio.wait_for(cancelled.wait(), 10)  # its generation stops with it
            with pytest.raises(openai.APIError):
                await call
    assert episode.calls == []
    assert episode.tokens.segments == []
    assert episode.in_flight == set()


async def test_a_failure_of_the_gateway_itself_is_a_500_body_and_kept_for_the_sample(qwen_tokenizer):
    async def broken(plan: CallPlan, max_tokens: int) -> Completion:
        return Completion(
            text="ok", token_ids=[1, 2, 3], logprobs=[-0.5], finish_reason="stop"
        )  # 3 ids, 1 logprob

    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), broken, LIMITS)
        async with _client(episode) as client:
            with pytest.raises(openai.InternalServerError, match="the agent gateway failed on this call"):
                await client.chat.completions.create(model="m", messages=QUESTION)
    assert episode.error.startswith("the agent gateway failed: ValueError: 3 ids but 1 logprobs")


async def test_an_episode_on_its_own_unix_socket_answers_there_only(qwen_tokenizer, tmp_path):
    model = Scripted(qwen_tokenizer, ["ok"] * 4)
    async with AgentGateway() as gateway:
        boxed = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        plain = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        path = await gateway.listen_unix(boxed)
        assert oct(os.stat(path).st_mode & 0o777) == "0o666"  # a sandbox's own user connects
        assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"

        async def status(episode: Any, unix: str | None) -> int:
            connector = aiohttp.UnixConnector(path=unix) if unix else None
            headers = {"Authorization": f"Bearer {episode.api_key}"}
            async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
                url = f"http://127.0.0.1:{gateway.port}/e/{episode.id}/v1/models"
                async with http.get(url) as response:
                    return response.status

        assert await status(boxed, path) == 200
        assert await status(boxed, None) == 401  # not over loopback TCP
        assert await status(plain, path) == 401  # its socket answers no other episode
        assert await status(plain, None) == 200
        gateway.close_episode(boxed)
        assert not os.path.exists(os.path.dirname(path))


async def test_completions_take_token_ids_and_text_and_extend_the_episode_or_split_with_the_reason(
    qwen_tokenizer,
):
    tok = qwen_tokenizer
    model = Scripted(tok, ["Paris", "France", "Lyon", "x", "y"])
    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(tok), model, LIMITS)
        first_prompt = tok.encode("Q: capital? A:")
        async with _client(episode) as client:
            one = await client.completions.create(
                model="m", prompt=first_prompt, extra_body={"return_token_ids": True}
            )
            assert one.object == "text_completion"
            assert one.choices[0].text == "Paris"
            sampled = model.sampled[0]
            extra: Any = one.choices[0].model_extra
            assert (extra["prompt_token_ids"], extra["token_ids"]) == (first_prompt, sampled)
            # token-in: everything so far and more ids extends the episode
            more = tok.encode(" Country:")
            await client.completions.create(model="m", prompt=[*first_prompt, *sampled, *more])
            # text: everything so far, decoded, and more text extends it too (the tail encoded alone)
            so_far = tok.decode([*first_prompt, *sampled, *more, *model.sampled[1]])
            chunks = [
                c
                async for c in await client.completions.create(
                    model="m", prompt=so_far + " City:", stream=True
                )
            ]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == "Lyon"
            (seg,) = episode.tokens.segments
            t = seg.tokens.trajectory
            assert t.prompt_ids == first_prompt
            city = tok.encode(" City:")
            assert t.completion_ids == [*sampled, *more, *model.sampled[1], *city, *model.sampled[2]]
            assert t.completion_mask == [1] * len(sampled) + [0] * len(more) + [1] * len(model.sampled[1]) + [
                0
            ] * len(city) + [1] * len(model.sampled[2])
            # a prompt that drops the history is a new sequence, with the reason
            await client.completions.create(model="m", prompt=first_prompt)
            await client.chat.completions.create(model="m", messages=QUESTION)
        assert [s.reason for s in episode.tokens.segments] == ["", "history_truncated", "endpoint_changed"]
        assert model.prompts[1] == [*first_prompt, *sampled, *more]
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {episode.api_key}"}) as http:
            for bad in ("", [], ["a", "b"], [1, -2], [True]):
                async with http.post(episode.base_url + "/completions", json={"prompt": bad}) as r:
                    assert r.status == 400
                    assert "prompt must be one non-empty text" in (await r.json())["error"]["message"]
            async with http.post(episode.base_url + "/completions", json={"prompt": [1, 10**7]}) as r:
                assert r.status == 400
                assert (
                    "token id 10000000, but this model's tokenizer has"
                    in (await r.json())["error"]["message"]
                )


async def test_an_agent_that_floods_its_endpoint_gets_429_past_its_pending_calls(qwen_tokenizer):
    release = asyncio.Event()
    scripted = Scripted(qwen_tokenizer, ["ok"] * 10)

    async def held(plan: CallPlan, max_tokens: int) -> Completion:
        await release.wait()
        return await scripted(plan, max_tokens)

    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), held, LIMITS)
        headers = {"Authorization": f"Bearer {episode.api_key}"}
        async with aiohttp.ClientSession(headers=headers) as http:

            async def call() -> int:
                async with http.post(
                    episode.base_url + "/chat/completions", json={"messages": QUESTION}
                ) as r:
                    return r.status

            calls = [asyncio.create_task(call()) for _ in range(6)]
            while len(episode.in_flight) < LIMITS.max_pending_calls:
                await asyncio.sleep(0.01)
            await asyncio.wait(calls, timeout=5, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(0.2)  # the other flooding call is refused at once too
            assert sorted(t.result() for t in calls if t.done()) == [429, 429]
            release.set()
            statuses = sorted(await asyncio.gather(*calls))
    assert statuses == [200] * 4 + [429] * 2
    assert episode.refused == []  # told to wait, not refused: it does not use up max_calls


async def test_anthropics_messages_api_reaches_the_same_episode_with_its_own_client(qwen_tokenizer):
    import anthropic

    call = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>'
    model = Scripted(qwen_tokenizer, [call, "42", "ok"])
    tools = [
        {
            "name": "add",
            "description": "Add two integers.",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
    ]
    async with AgentGateway() as gateway:
        episode = gateway.open_episode(TurnTokenizer(qwen_tokenizer), model, LIMITS)
        base = episode.base_url.removesuffix("/v1")  # Anthropic's SDK adds /v1/messages
        client: Any = anthropic.AsyncAnthropic(base_url=base, api_key=episode.api_key, max_retries=0)
        async with client:
            messages: list[Any] = [{"role": "user", "content": "What is 12 + 30?"}]
            first = await client.messages.create(
                model="m", max_tokens=64, system="Use the tools.", messages=messages, tools=tools
            )
            assert first.stop_reason == "tool_use"
            (use,) = first.content
            assert (use.type, use.id, use.name, use.input) == (
                "tool_use",
                "call_0_0",
                "add",
                {"a": 12, "b": 30},
            )
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}],
                },
            ]
            async with client.messages.stream(
                model="m", max_tokens=64, system="Use the tools.", messages=messages, tools=tools
            ) as stream:
                second = await stream.get_final_message()
            assert [b.text for b in second.content] == ["42"]
            assert (second.stop_reason, second.usage.output_tokens) == ("end_turn", len(model.sampled[1]))
            image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
            with pytest.raises(anthropic.BadRequestError, match="only text, tool_use"):
                await client.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": [image]}]
                )
            result = {"type": "tool_result", "tool_use_id": "x", "content": [image]}
            with pytest.raises(anthropic.BadRequestError, match="only text results are supported"):
                await client.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": [result]}]
                )
            search = {"type": "web_search_20250305", "name": "web_search"}
            with pytest.raises(anthropic.BadRequestError, match="must be a custom tool"):
                await client.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}], tools=[search]
                )
        wrong: Any = anthropic.AsyncAnthropic(base_url=base, api_key="nope", max_retries=0)
        async with wrong:
            with pytest.raises(anthropic.AuthenticationError):
                await wrong.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
    # both calls were one training sequence: the tool result extended the episode
    (seg,) = episode.tokens.segments
    trained = [
        i
        for i, m in zip(
            seg.tokens.trajectory.completion_ids, seg.tokens.trajectory.completion_mask, strict=True
        )
        if m
    ]
    assert trained == [*model.sampled[0], *model.sampled[1]]
