"""A conversation as one training sequence with its assistant mask (supervised fine-tuning)."""

from __future__ import annotations

import pytest

from telescope_rollout.chat import TemplateError, conversation_tokens

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "The answer is 42."},
    {"role": "user", "content": "Guess a word."},
    {"role": "assistant", "content": "crane"},
]


def trained(tokenizer, out) -> list[str]:
    """The trained stretches of the sequence, as text, one per run of mask 1."""
    runs, current = [], []
    for token, m in zip(out.ids, out.mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_only_the_assistants_words_and_end_of_turn_are_trained_on(tokenizer):
    out = conversation_tokens(tokenizer, CONVERSATION)
    assert tokenizer.decode(out.ids) == out.text
    assert out.ids == tokenizer.encode(out.text)
    assert len(out.mask) == len(out.ids)
    # ChatML: "<|im_start|>assistant\n" is the generation prompt (never trained), the newline after
    # <|im_end|> is the template's formatting
    assert trained(tokenizer, out) == ["The answer is 42.<|im_end|>", "crane<|im_end|>"]
    # every token of the system and user turns, and every role header, has mask 0
    untrained = tokenizer.decode([t for t, m in zip(out.ids, out.mask, strict=True) if not m])
    assert "What is 12 + 30?" in untrained
    assert untrained.count("<|im_start|>assistant\n") == 2


def test_tool_calls_are_trained_on_and_tool_results_are_not(qwen_tokenizer):
    calls = [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    messages = [
        {"role": "user", "content": "Add 1 and 2."},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "It is 3."},
    ]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    out = conversation_tokens(qwen_tokenizer, messages, tools=tools)
    runs = trained(qwen_tokenizer, out)
    assert len(runs) == 2
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>' in runs[0]
    assert runs[1].endswith("It is 3.<|im_end|>")
    untrained = qwen_tokenizer.decode([t for t, m in zip(out.ids, out.mask, strict=True) if not m])
    assert "<tool_response>\n3\n</tool_response>" in untrained


def test_earlier_reasoning_goes_as_the_template_drops_it(qwen_tokenizer):
    # a Qwen3-style template keeps the reasoning of the turn after the last user message only, and
    # writes an empty think block into the last turn: trained as rendered
    messages = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "<think>greet</think>Hello."},
        {"role": "user", "content": "Bye."},
        {"role": "assistant", "content": "<think>leave</think>Bye."},
    ]
    out = conversation_tokens(qwen_tokenizer, messages)
    assert trained(qwen_tokenizer, out) == ["Hello.<|im_end|>", "<think>\nleave\n</think>\n\nBye.<|im_end|>"]


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    from telescope_rollout.chat import ChatTemplate

    counting = ChatTemplate(
        "{{ messages | length }} messages\n{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
        eos_token="<|im_end|>",
    )
    other = type(tokenizer)(tokenizer.backend, counting)
    with pytest.raises(TemplateError, match="assistant message 2"):
        conversation_tokens(other, CONVERSATION)


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "at least one message"),
        ([{"role": "user", "content": "hi"}], "no assistant message"),
        ([{"role": "bot", "content": "hi"}], "message 0 has role 'bot'"),
        (
            [{"role": "user", "content": ["a list"]}, {"role": "assistant", "content": "x"}],
            "content must be text",
        ),
    ],
)
def test_bad_conversations_say_what_is_wrong(tokenizer, messages, match):
    with pytest.raises(ValueError, match=match):
        conversation_tokens(tokenizer, messages)


def test_tool_calls_need_a_template_that_reads_tools(tokenizer):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{}]}]
    with pytest.raises(TemplateError, match="does not read `tools`"):
        conversation_tokens(tokenizer, messages)
