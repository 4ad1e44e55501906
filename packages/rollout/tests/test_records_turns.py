"""What a sample records (docs/rollout.md, "What a sample records"): its turns in order, its
wall-clock times, its tool-call records and the client's per-request timings, driven with the
in-process fake server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from engine_fakes import EchoEnv, make_engine

from telescope_rollout import (
    EngineSettings,
    MultiTurnEnvironment,
    RolloutState,
    Sample,
    ToolEnvironment,
)
from telescope_rollout.engine import Turn
from telescope_rollout.engine._episode import Play, play_sample
from telescope_rollout.engine._prompts import PromptSource
from telescope_rollout.engine._results import ScoredSample
from telescope_rollout.envs import RunResult, TrajectoryStep
from telescope_rollout.inference._client import parse_completion, server_timings
from telescope_rollout.testing import FakeInferenceServer, FakeRequest, sample_ids, settle

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


class Calc(ToolEnvironment):
    """One prompt; reward 1 when the final answer is 5."""

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("What is 2+3?", "5")], num_samples)

    async def compute_reward(self, state: RolloutState, eos_token: str = "") -> float:
        return float(state.last_completion_text.strip() == "5")


def call_then_answer(req: FakeRequest) -> tuple[str, list[int]]:
    """Turn 0 calls ``add(2, 3)`` (ids [5, 6]); turn 1 answers "5" (id [7])."""
    return (CALL, [5, 6]) if req.request_id.endswith("-turn-0") else ("5", [7])


async def test_tool_episode_records_model_and_env_turns_in_order(tokenizer):
    env = Calc(tools=[add], system_prompt="Use tools.", max_turns=4)
    server = FakeInferenceServer(reply=call_then_answer)
    engine = make_engine(tokenizer, server, env=env, discard_group_zero_advantage=False)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    group = batch.groups[0]
    s = group.samples[0]
    assert (s.num_turns, s.finish_reason, s.reward) == (2, "final_answer", 1.0)
    # model, env (the tool result), model; the final empty env step adds no turn
    assert [(t.index, t.role, t.turn_type) for t in s.turns] == [
        (0, "model", "generation"),
        (1, "env", "tool_result"),
        (2, "model", "generation"),
    ]
    m0, e1, m2 = s.turns
    assert (m0.text, m0.tokens, m0.stop_reason, m0.server) == (CALL, 2, "stop", "http://fake-0")
    assert (m2.text, m2.tokens) == ("5", 1)
    assert (m0.request_id, m2.request_id) == (f"sample-{s.sample_id}-turn-0", f"sample-{s.sample_id}-turn-1")
    reqs = [r for r in server.requests if r.request_id.startswith(f"sample-{s.sample_id}-")]
    assert (m0.prompt_tokens, m2.prompt_tokens) == (len(reqs[0].prompt), len(reqs[1].prompt))
    assert (m0.version_start, m0.version_end, m2.version_start, m2.version_end) == (0, 0, 0, 0)
    assert set(m0.timings) == {"e2e_s"}  # the fake server reports no vLLM timings
    assert m0.timings["e2e_s"] >= 0.0
    # env turn: the reply's text; its tokens = the template's closing tokens + the framed reply
    assert e1.text == "[add] 5"
    assert (e1.prompt_tokens, e1.stop_reason, e1.server, e1.request_id) == (-1, None, "", "")
    assert (e1.version_start, e1.version_end) == (-1, -1)
    tt = engine.prompts.turn_tokenizer
    reply = [{"role": "user", "content": "[add] 5", "turn_type": "tool_result"}]
    assert e1.tokens == len(tt.suffix_after([5, 6])) + len(tt.env_ids(reply))
    assert sum(t.tokens for t in s.turns) == len(s.completion_ids)
    # sample fields
    assert s.system_prompt.startswith("Use tools.\n\n# Available Tools")
    assert s.sample_index == group.sample_index == 0


async def test_turn_times_lie_within_the_sample_and_the_tool_call_inside_its_env_turn(tokenizer):
    env = Calc(tools=[add], max_turns=4)
    server = FakeInferenceServer(reply=call_then_answer)
    engine = make_engine(tokenizer, server, env=env, discard_group_zero_advantage=False)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    for s in batch.samples:
        assert s.dispatched_at is not None
        assert s.reward_start is not None
        assert s.reward_end is not None
        times = [s.dispatched_at]
        for t in s.turns:
            times += [t.start, t.end]
        times += [s.reward_start, s.reward_end]
        assert times == sorted(times)
        assert s.dispatched_at > 1e9  # wall clock, not the engine's monotonic clock
        assert s.finished_at == s.reward_end
        (call,) = s.tool_calls
        env_turn = s.turns[1]
        assert env_turn.start <= call["start"] <= call["start"] + call["duration_s"] <= env_turn.end
        assert call["duration_s"] >= 0.0
        assert (call["truncated"], call["exit_code"], call["sandbox"]) == (False, None, "")
        assert (call["generation_idx"], call["tool_call_idx"], call["result"]) == (0, 0, "5")


def _turn(state: RolloutState, text: str) -> list[dict[str, Any]]:
    state.trajectory.append(TrajectoryStep(prompt=[], completion=[{"role": "assistant", "content": text}]))
    return [{"role": "assistant", "content": text}]


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def test_tool_records_mark_truncation_and_sandbox_exit_codes():
    def big() -> str:
        """A lot."""
        return "y" * 10_000

    def echo(text: str) -> str:
        """Echo."""
        return text

    def run_program() -> RunResult:
        """Runs a program in a sandbox."""
        return RunResult(stdout="boom", exit_code=3)

    def remote() -> dict[str, Any]:
        """Runs a program in a named sandbox."""
        return {"stdout": "", "exit_code": 0, "sandbox_id": "sb-7"}

    env = Calc(tools=[big, echo, run_program, remote], max_turns=5, provider="local")
    state = env.create_initial_state(env.load_dataset()[0])
    text = _call("big") + _call("echo", text="z" * 3000) + _call("run_program") + _call("remote")
    await env.step(_turn(state, text), state)
    big_r, echo_r, prog_r, remote_r = state.custom["tool_calls"]
    assert big_r["truncated"]
    assert "[truncated, 10000 characters]" in big_r["result"]
    assert echo_r["truncated"]  # its arguments and raw text were cut for the record
    assert (len(echo_r["arguments"]), len(echo_r["raw_text"])) == (2000, 2000)
    assert (big_r["exit_code"], big_r["sandbox"], echo_r["exit_code"]) == (None, "", None)
    # a sandbox's result object: its exit code, the sandbox named by the env's provider
    assert (prog_r["exit_code"], prog_r["sandbox"], prog_r["truncated"], prog_r["success"]) == (
        3,
        "local",
        False,
        True,
    )
    assert (remote_r["exit_code"], remote_r["sandbox"]) == (0, "sb-7")
    assert all(r["start"] > 1e9 for r in state.custom["tool_calls"])


async def test_an_overridden_execute_tool_is_still_used():
    class Custom(Calc):
        async def execute_tool(self, call, state=None):
            return True, "custom"

    env = Custom(tools=[add], max_turns=5)
    state = env.create_initial_state(env.load_dataset()[0])
    (reply,) = (await env.step(_turn(state, CALL), state))[0]
    assert reply["content"] == "[add] custom"
    (record,) = state.custom["tool_calls"]
    assert (record["result"], record["exit_code"], record["truncated"]) == ("custom", None, False)


class Counting(MultiTurnEnvironment):
    """Answers "again" until three model turns."""

    max_turns = 3

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample("start")], num_samples)

    def env_response(self, messages, state):
        return [{"role": "user", "content": "again", "turn_type": "feedback"}]

    def compute_reward(self, state, eos_token=""):
        return float(state.num_turns)


async def test_the_reply_that_ends_an_episode_is_a_turn_without_tokens(tokenizer):
    server = FakeInferenceServer(reply=lambda r: ("hi", [7, 8]))
    engine = make_engine(tokenizer, server, env=Counting(), discard_group_zero_advantage=False)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    s = batch.samples[0]
    assert [(t.role, t.turn_type) for t in s.turns] == [
        ("model", "generation"),
        ("env", "feedback"),
        ("model", "generation"),
        ("env", "feedback"),
        ("model", "generation"),
        ("env", "feedback"),
    ]
    assert [t.index for t in s.turns] == list(range(6))
    assert s.turns[-1].tokens == -1  # max_turns reached: the reply never went into the tokens
    assert s.turns[1].tokens > 0
    assert sum(t.tokens for t in s.turns[:-1]) == len(s.completion_ids)


async def test_a_drained_sample_keeps_the_turns_it_completed(tokenizer):
    # samples from 4 on are held too: the engine must not run on to its async limit, where group 0
    # could no longer be kept and would be cancelled (max_async) before the drain this test makes
    server = FakeInferenceServer(
        reply=lambda r: ("hi", [7, 8]),
        hold=lambda r: r.request_id == "sample-0-turn-1" or sample_ids([r])[0] >= 4,
    )
    engine = make_engine(
        tokenizer, server, env=Counting(), discard_group_zero_advantage=False, max_async_rollout=1
    )
    async with engine:
        await settle()  # group 1 makes batch 0; group 0 waits on its second turn
        assert 0 in sample_ids(server.pending)
        await engine.drain_servers(["http://fake-0"])
        engine.restore_servers(["http://fake-0"])
        engine.weights_updated(1)
        server.hold = None
        server.release()
        cancelled = []
        for _ in range(5):
            cancelled += [
                d for d in (await engine.next_batch(timeout_s=10)).cancelled if d.group.group_id == 0
            ]
            if cancelled:
                break
    s0, s1 = cancelled[0].group.samples
    assert (cancelled[0].reason, s0.error) == ("eval_drain", "cancelled")
    assert [(t.index, t.role) for t in s0.turns] == [(0, "model"), (1, "env")]
    assert s0.dispatched_at <= s0.turns[-1].end <= s0.finished_at
    assert (s0.reward_start, s0.reward_end) == (None, None)  # never scored
    assert len(s1.turns) == 6  # its sibling had finished


async def test_model_turn_versions_are_those_of_its_server_at_send_and_return(tokenizer):
    # samples from 8 on are held too, so the engine cannot run on to its async limit (where sample 0's
    # group could no longer be kept and would be cancelled before the update)
    server = FakeInferenceServer(
        reply=lambda r: ("1", [1]), hold=lambda r: r.request_id == "sample-0" or sample_ids([r])[0] >= 8
    )
    engine = make_engine(tokenizer, server, max_off_policy_steps=-1, discard_group_zero_advantage=False)
    async with engine:
        await settle()
        engine.weights_updated(1)
        server.hold = None
        server.release()
        found: list[ScoredSample] = []
        for _ in range(13):  # it lands in a batch, kept or (too stale) discarded
            b = await engine.next_batch(timeout_s=10)
            groups = [*b.groups, *(d.group for d in b.discarded)]
            found += [s for g in groups for s in g.samples if s.sample_id == 0]
            if found:
                break
    (s0,) = found
    (turn,) = s0.turns
    assert (turn.version_start, turn.version_end) == (0, 1)
    assert (s0.version_start, s0.version_end) == (0, 1)


async def test_an_eval_style_play_records_one_turn_with_unknown_versions(tokenizer):
    env = EchoEnv(system_prompt="Be brief.")
    env.load_dataset()
    settings = EngineSettings(max_tokens=16, max_model_len=256, enable_thinking=None)
    prompts = PromptSource({"echo": env}, None, tokenizer)
    sample = env.get_sample(3)
    prompt = prompts.prepare(env, "echo", 3, Sample(sample.prompt, sample.answer, {"_index": 3}))
    out = ScoredSample(group_id=3, sample_id=0, env_name="echo", server="http://fake-0")
    play = Play(
        FakeInferenceServer(reply=lambda r: ("3", [4])), settings, prompts, "", request_prefix="eval-x"
    )
    assert await play_sample(env, prompt, out, play) is None
    assert (out.error, out.reward, out.sample_index, out.system_prompt) == (None, 3.0, 3, "Be brief.")
    (turn,) = out.turns
    assert turn == Turn(
        index=0, role="model", turn_type="generation", text="3", tokens=1, prompt_tokens=len(prompt.ids),
        stop_reason="stop", server="http://fake-0", version_start=-1, version_end=-1, start=turn.start,
        end=turn.end, request_id="eval-x-0", timings=turn.timings,
    )  # fmt: skip
    assert out.dispatched_at is not None
    assert out.reward_start is not None
    assert out.reward_end is not None
    assert out.dispatched_at <= turn.start <= turn.end <= out.reward_start <= out.reward_end
    assert out.finished_at == out.reward_end


def test_vllm_per_request_metrics_become_timings_in_seconds():
    metrics = {"time_to_first_token_ms": 85.0, "generation_time_ms": 1240.0, "queue_time_ms": 12.0,
               "mean_itl_ms": 9.1, "tokens_per_second": 103.2}  # fmt: skip
    assert server_timings(metrics) == pytest.approx(
        {"queue_s": 0.012, "prefill_s": 0.085, "decode_s": 1.24, "inference_s": 1.325, "ttft_s": 0.097}
    )
    assert server_timings(None) == {}
    assert server_timings({"queue_time_ms": None, "generation_time_ms": 5}) == {"decode_s": 0.005}
    body = {"id": "x", "choices": [{"text": "a", "token_ids": [1], "finish_reason": "stop"}]}
    assert parse_completion({**body, "metrics": metrics}, "u", 2.0).timings["e2e_s"] == 2.0
    assert parse_completion(body, "u", 0.5).timings == {"e2e_s": 0.5}
    assert parse_completion(body, "u").timings == {}
