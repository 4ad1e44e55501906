import asyncio
import json
import time
from typing import Literal

from telescope_rollout import RolloutState, Sample, ToolEnvironment
from telescope_rollout.envs import TrajectoryStep, func_to_tool_schema, parse_tool_calls


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


async def search(query: str, tags: list[str] | None = None, mode: Literal["fast", "deep"] = "fast") -> str:
    """Search the notes."""
    await asyncio.sleep(0)
    return f"found {query} {tags or []} {mode}"


def divide(x: float, y: float) -> float:
    """Divide x by y."""
    return x / y


async def slow() -> str:
    """Never finishes in time."""
    await asyncio.sleep(10)
    return "late"


def test_schema_from_types_and_docstring():
    s = func_to_tool_schema(add)["function"]
    assert s["name"] == "add"
    assert s["description"] == "Add two integers."
    assert s["parameters"] == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "integer", "description": "the second number"},
        },
        "required": ["a"],
    }
    p = func_to_tool_schema(search)["function"]["parameters"]["properties"]
    assert p["tags"] == {"type": "array", "items": {"type": "string"}}
    assert p["mode"] == {"type": "string", "enum": ["fast", "deep"]}


def test_parse_hermes_xml_and_function_forms():
    text = (
        'a <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        "<TOOL_CALL>\n<function=search>\n<parameter=query>\ncats\n</parameter>\n"
        '<parameter=tags>["x"]</parameter>\n</function>\n</TOOL_CALL>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 5}"}'  # unclosed final call
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("add", {"a": 1, "b": 2}, None),
        ("search", {"query": "cats", "tags": ["x"]}, None),
        ("add", {"a": 5}, None),
    ]
    fcalls = parse_tool_calls(
        "add(1, b=2) and search(query=\"a)b\", tags=['('])", "function", ["add", "search"]
    )
    assert [(c.name, c.arguments) for c in fcalls] == [
        ("add", {"0": 1, "b": 2}),
        ("search", {"query": "a)b", "tags": ["("]}),
    ]
    bad = parse_tool_calls("add(__import__('os'))", "function", ["add"])
    assert bad[0].error


def test_broken_calls_become_errors_not_exceptions():
    cases = [
        "<tool_call>{not json}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        "<tool_call><function>no name</function></tool_call>",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
    ]
    for text in cases:
        (call,) = parse_tool_calls(text)
        assert call.error


def test_megabyte_of_garbage_is_fast_and_capped():
    garbage = ('<tool_call>{"name": ' + "x" * 50 + "<function=<parameter=") * 20_000 + "\x00\ud800"
    t0 = time.perf_counter()
    calls = parse_tool_calls(garbage)
    parse_tool_calls(garbage, "function", ["add"])
    parse_tool_calls("add(" * 250_000, "function", ["add"])
    assert time.perf_counter() - t0 < 5.0
    assert len(calls) <= 16


class Calc(ToolEnvironment):
    def load_dataset(self, num_samples=-1, **kw):
        return self._set_samples([Sample("What is 2+3?", "5")], num_samples)

    async def compute_reward(self, state, eos_token=""):
        return float(state.last_completion_text.strip() == "5")


def _turn(state, text):
    state.trajectory.append(TrajectoryStep(prompt=[], completion=[{"role": "assistant", "content": text}]))
    return [{"role": "assistant", "content": text}]


async def test_tool_env_runs_tools_and_reports_errors():
    env = Calc(tools=[add, search, divide, slow], system_prompt="Use tools.", max_turns=5)
    env.tool_timeout_s = 0.05
    sample = env.load_dataset()[0]
    prompt = env.get_initial_prompt(sample)
    assert prompt[0]["role"] == "system"
    assert "# Available Tools" in prompt[0]["content"]
    assert "- a (integer) (required)" in prompt[0]["content"]
    assert prompt[0]["content"].startswith("Use tools.")
    state = env.create_initial_state(sample)

    text = (
        '<tool_call>{"name": "add", "arguments": {"a": "2", "b": 3}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"c": 1}}</tool_call>'
        '<tool_call>{"name": "divide", "arguments": {"x": 1, "y": 0}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {}}</tool_call>'
        "<tool_call>{broken</tool_call>"
    )
    reply, done, _ = await env.step(_turn(state, text), state)
    assert not done
    (msg,) = reply
    assert msg["turn_type"] == "tool_result"
    body = msg["content"]
    assert "Tool 1: [add] 5" in body
    assert "unknown tool 'nope'" in body
    assert "available tools: add, search, divide, slow" in body
    assert "argument_error" in body
    assert "ZeroDivisionError" in body
    assert "[search] found q [] fast" in body
    assert "TimeoutError" in body
    assert "invalid JSON" in body

    reply, done, reason = await env.step(_turn(state, "5"), state)
    assert reply == []
    assert done
    assert reason == "final_answer"
    assert (await env.score(state)).total_reward == 1.0
    m = env.get_tool_metrics(state)
    assert m["total_tool_calls"] == 7
    assert m["tool_success_count"] == 2
    assert m["add_calls"] == 2
    assert m["unique_tools_used"] == 5
    json.dumps(state.custom["tool_calls"])  # records are JSON-able for the tool_calls table


async def test_max_turns_and_huge_results():
    def big() -> str:
        """A lot."""
        return "y" * 100_000

    env = Calc(tools=[big], max_turns=1, include_tool_schemas_in_prompt=False)
    sample = env.load_dataset()[0]
    assert env.get_initial_prompt(sample) == [{"role": "user", "content": "What is 2+3?"}]
    state = env.create_initial_state(sample)
    reply, done, reason = await env.step(_turn(state, '<tool_call>{"name": "big"}</tool_call>'), state)
    assert done
    assert reason == "max_turns_reached"
    assert len(reply[0]["content"]) < 9_000
    assert "truncated" in reply[0]["content"]


async def test_tool_receives_state():
    def note(text: str, state: RolloutState) -> str:
        """Save a note."""
        state.custom["note"] = text
        return "ok"

    env = Calc(tools=[note])
    assert "state" not in env.tool_schemas[0]["function"]["parameters"]["properties"]
    state = env.create_initial_state(Sample("q"))
    await env.step(_turn(state, 'note(text="hi")'), state)  # xml format: not a call
    assert "note" not in state.custom
    await env.step(
        _turn(state, '<tool_call>{"name": "note", "arguments": {"text": "hi"}}</tool_call>'), state
    )
    assert state.custom["note"] == "hi"
