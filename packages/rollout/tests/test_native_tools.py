"""Native ``tools=`` chat-template tool calling with a Qwen/Hermes-style template.

Expected texts are written by hand from the template's rules (fixtures/qwen3_like.jinja).
"""

import json

import pytest

from telescope_rollout import ChatTemplate, Sample, ToolEnvironment
from telescope_rollout.chat import MultiTurnTokens, TurnTokenizer
from telescope_rollout.envs import TrajectoryStep


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


class Calc(ToolEnvironment):
    def load_dataset(self, num_samples=-1, **kw):
        return self._set_samples([Sample("What is 2+3?", "5")], num_samples)

    def compute_reward(self, state, eos_token=""):
        return 0.0


# json.dumps of the schema func_to_tool_schema documents for `add`, written out by hand.
ADD_SCHEMA_JSON = (
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, '
    '"required": ["a"]}}}'
)
SYSTEM_WITH_TOOLS = (
    "<|im_start|>system\nUse tools.\n\n# Tools\n\nFunctions you can call, one JSON signature per line:\n"
    f"<tools>\n{ADD_SCHEMA_JSON}\n</tools>\n\nTo call a function, reply with:\n<tool_call>\n"
    '{"name": <name>, "arguments": <json object>}\n</tool_call><|im_end|>\n'
)
TURN1 = (
    "<think>\nneed to add\n</think>\n\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
)
TURN2 = "<think>\nit is 5\n</think>\n\nThe answer is 5."


def _step(state, message):
    state.trajectory.append(TrajectoryStep(prompt=[], completion=[message]))
    return [message]


def test_supports_tools(qwen_tokenizer, tokenizer):
    assert qwen_tokenizer.template.supports_tools
    assert not tokenizer.template.supports_tools
    assert ChatTemplate("{% for t in tools or [] %}{{ t }}{% endfor %}").supports_tools
    assert not ChatTemplate("{% set tools = [] %}{{ tools }}").supports_tools  # assigned, not read


def test_default_puts_the_tools_in_the_prompt_text(qwen_tokenizer):
    env = Calc(tools=[add], system_prompt="Use tools.")
    assert env.template_kwargs() == {}
    prompt = env.get_initial_prompt(env.load_dataset()[0], qwen_tokenizer)
    assert "# Available Tools" in prompt[0]["content"]
    assert env.completion_message(TURN1) == {"role": "assistant", "content": TURN1}


def test_native_prompt_renders_tools_through_the_template(qwen_tokenizer, tokenizer):
    env = Calc(tools=[add], system_prompt="Use tools.", tools_in_template=True)
    assert env.template_kwargs() == {"tools": env.tool_schemas}
    sample = env.load_dataset()[0]
    prompt = env.get_initial_prompt(sample, qwen_tokenizer)
    assert prompt == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2+3?"},
    ]  # the schemas are not in the text: the template shows them
    text = qwen_tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **env.template_kwargs())
    assert text == SYSTEM_WITH_TOOLS + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    both = Calc(tools=[add], tools_in_template=True, include_tool_schemas_in_prompt=True)
    assert "# Available Tools" in both.get_initial_prompt(sample, qwen_tokenizer)[0]["content"]
    with pytest.raises(ValueError, match="tools_in_template"):
        env.get_initial_prompt(sample, tokenizer)  # ChatML fixture: no `tools` variable


async def test_native_multi_turn_ids_equal_the_full_rendering(qwen_tokenizer):
    tok = qwen_tokenizer
    env = Calc(tools=[add], system_prompt="Use tools.", tools_in_template=True)
    sample = env.load_dataset()[0]
    state = env.create_initial_state(sample)
    messages = env.get_initial_prompt(sample, tok)
    base = TurnTokenizer(tok)
    tt = base.for_kwargs(env.template_kwargs())  # how the engine derives a per-environment one
    assert tt is base.for_kwargs(env.template_kwargs())
    assert base.for_kwargs({}) is base
    assert tt.prompt_ids(messages) != base.prompt_ids(messages)  # the tools are in the system turn
    mt = MultiTurnTokens(tt, messages)

    ids1 = [*tok.encode(TURN1), tok.eos_token_id]
    mt.add_model_turn(ids1, [-0.5] * len(ids1), text=TURN1)
    assistant1 = env.completion_message(TURN1)
    assert assistant1 == {
        "role": "assistant",
        "content": "<think>\nneed to add\n</think>",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
        ],
    }
    reply, done, _ = await env.step(_step(state, assistant1), state)
    assert not done
    assert reply == [
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5", "turn_type": "tool_result"}
    ]
    mt.add_env_turn(reply)
    assert mt.prefix_status() == "exact"  # tool replies are not user queries: reasoning is kept

    ids2 = [*tok.encode(TURN2), tok.eos_token_id]
    mt.add_model_turn(ids2, [-0.5] * len(ids2), text=TURN2)
    _, done, reason = await env.step(_step(state, env.completion_message(TURN2)), state)
    assert (done, reason) == (True, "final_answer")

    expected = (
        SYSTEM_WITH_TOOLS + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        f"<|im_start|>assistant\n{TURN1}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n{TURN2}<|im_end|>\n"
    )
    # The conversation re-rendered from structured messages (tool_calls + tool role) ...
    structured = [*messages, assistant1, *reply, env.completion_message(TURN2)]
    full_text = tok.apply_chat_template(structured, **env.template_kwargs())
    assert full_text == expected
    # ... equals our ids token for token, and the mask covers exactly the two model turns.
    t = mt.trajectory
    ours = t.prompt_ids + t.completion_ids
    assert ours == tok.encode(expected)[: len(ours)]
    assert tok.decode(tok.encode(expected)[len(ours) :]) == "\n"
    ones = [i for i, m in enumerate(t.completion_mask) if m]
    n1 = len(ids1)
    env_len = len(t.completion_ids) - n1 - len(ids2)
    assert ones == [*range(n1), *range(n1 + env_len, n1 + env_len + len(ids2))]
    assert tok.decode(t.completion_ids[n1 : n1 + env_len]) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


async def test_native_several_calls_errors_and_structured_input(qwen_tokenizer):
    env = Calc(tools=[add], tools_in_template=True)
    state = env.create_initial_state(env.load_dataset()[0])
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mul", "arguments": {}}\n</tool_call>\n'
        "<tool_call>\n{broken\n</tool_call>"
    )
    msg = env.completion_message(text)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["add", "mul"]  # broken JSON left out
    assert msg["content"] == ""
    reply, _, _ = await env.step(_step(state, {"role": "assistant", "content": text}), state)
    assert [(m["role"], m["tool_call_id"], m["name"]) for m in reply] == [
        ("tool", "call_0", "add"),
        ("tool", "call_1", "mul"),
        ("tool", "call_invalid_2", ""),
    ]
    # The same ids whether the env sees the raw text or the structured message.
    assert [c["id"] for c in msg["tool_calls"]] == ["call_0", "call_1"]
    again, _, _ = await env.step(_step(state, {**msg, "tool_calls": msg["tool_calls"][::-1]}), state)
    assert [(m["tool_call_id"], m["name"]) for m in again] == [("call_1", "mul"), ("call_0", "add")]
    assert reply[0]["content"] == "1"
    assert reply[1]["content"].startswith("Error: unknown tool 'mul'")
    assert reply[2]["content"].startswith("Error: invalid JSON")
    rendered = qwen_tokenizer.apply_chat_template(reply)
    assert rendered.count("<|im_start|>user") == 1  # consecutive tool messages: one user turn
    assert rendered.count("<tool_response>") == 3

    # Structured tool_calls (arguments as JSON text, as OpenAI-style servers return them) run too;
    # malformed entries become errors, never exceptions.
    structured = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "add", "arguments": json.dumps({"a": 4, "b": 5})}},
            {"function": {"name": "add", "arguments": "{not json"}},
            {"function": {"arguments": {}}},
            "garbage",
            {"function": {"name": "add", "arguments": [1, 2]}},
        ],
    }
    reply, _, _ = await env.step(_step(state, structured), state)
    assert [m["content"][:14] for m in reply] == [
        "9",
        "Error: `argume",
        "Error: a tool ",
        "Error: a tool ",
        "Error: `argume",
    ]
    assert env.get_tool_metrics(state)["add_calls"] == 5
