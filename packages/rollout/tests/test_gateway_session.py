"""Token-in/token-out of agent episodes (telescope_rollout.gateway): the prefix rule, the splits and
their reasons, and the canonical form two serialisations of one conversation share."""

from __future__ import annotations

import json

import pytest

from telescope_rollout.chat import TurnTokenizer
from telescope_rollout.gateway import EpisodeTokens, RequestError, canonical_messages, canonical_tools

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is 12 + 30?"}


def _answer(episode: EpisodeTokens, tokenizer, messages, text: str, tools=None):
    """Plan a call with ``messages``, 'sample' ``text`` (ending with EOS), commit it; returns the plan,
    the sampled ids and the assistant message as an OpenAI client sends it back."""
    plan = episode.plan(canonical_messages(messages), canonical_tools(tools))
    ids = [*tokenizer.encode(text), tokenizer.eos_token_id]
    answer = {"role": "assistant", "content": text}
    episode.commit(plan, ids, [-0.25] * len(ids), text, canonical_messages([answer])[0])
    return plan, ids, answer


def test_calls_that_extend_the_conversation_are_one_sequence_of_the_sampled_tokens(tokenizer):
    tt = TurnTokenizer(tokenizer)
    episode = EpisodeTokens(tt)
    first, ids_1, answer_1 = _answer(episode, tokenizer, [SYSTEM, USER], "The answer is 42.")
    assert first.split == ""
    assert first.prompt_ids == tt.prompt_ids([SYSTEM, USER])
    # the agent re-serialises the conversation: content as text parts, SDK fields echoed back
    echoed = {**answer_1, "content": [{"type": "text", "text": answer_1["content"]}], "refusal": None}
    follow = {"role": "user", "content": "And 12 + 31?"}
    second, ids_2, _ = _answer(episode, tokenizer, [SYSTEM, USER, echoed, follow], "The answer is 43.")
    assert second.split is None, "an extension is no new segment"
    (seg,) = episode.segments
    t = seg.tokens.trajectory
    # the second prompt is built from ids: the first prompt, the sampled ids, the template's closing
    # suffix (minus the EOS the model sampled) and the new message's framing, by hand:
    suffix = tokenizer.encode("\n")  # ChatML: "<|im_end|>\n" after an answer, the model sampled <|im_end|>
    framing = tokenizer.encode("<|im_start|>user\nAnd 12 + 31?<|im_end|>\n<|im_start|>assistant\n")
    assert second.context_ids == [*suffix, *framing]
    assert second.prompt_ids == [*first.prompt_ids, *ids_1, *suffix, *framing]
    # the training sequence: the sampled ids with mask 1 and their logprobs, the context with mask 0
    assert t.prompt_ids == first.prompt_ids
    assert t.completion_ids == [*ids_1, *suffix, *framing, *ids_2]
    assert [i for i, m in zip(t.completion_ids, t.completion_mask, strict=True) if m] == [*ids_1, *ids_2]
    assert [lp for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if not m] == [0.0] * (
        len(suffix) + len(framing)
    )
    # and here, with an ordinary template, it is what rendering the whole conversation gives
    whole = tt.prompt_ids([SYSTEM, USER, answer_1, follow])
    assert second.prompt_ids == whole


def _episode_after_one_call(tokenizer, tools=None):
    episode = EpisodeTokens(TurnTokenizer(tokenizer))
    _, _, answer = _answer(episode, tokenizer, [SYSTEM, USER], "The answer is 42.", tools=tools)
    return episode, answer


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda a: [SYSTEM, USER], "resent"),
        (
            lambda a: [SYSTEM, {**a, "content": "42"}, {"role": "user", "content": "more"}],
            "history_rewritten@1",
        ),
        (
            lambda a: [SYSTEM, USER, {**a, "content": "42"}, {"role": "user", "content": "more"}],
            "assistant_edited@2",
        ),
        (lambda a: [{"role": "system", "content": "Be brief."}, USER, a, USER], "history_rewritten@0"),
        (lambda a: [SYSTEM, {"role": "user", "content": "summary so far"}], "history_rewritten@1"),
        (lambda a: [SYSTEM], "history_truncated"),
    ],
)
def test_a_history_the_agent_rewrote_starts_a_new_segment_with_the_reason(tokenizer, change, reason):
    episode, answer = _episode_after_one_call(tokenizer)
    messages = change(answer)
    plan, ids, _ = _answer(episode, tokenizer, messages, "Fine.")
    assert plan.split == reason
    assert [s.reason for s in episode.segments] == ["", reason]
    # the new segment is its messages rendered afresh, then the sampled ids
    t = episode.segments[1].tokens.trajectory
    assert t.prompt_ids == TurnTokenizer(tokenizer).prompt_ids(canonical_messages(messages))
    assert t.completion_ids == ids
    assert [s.calls for s in episode.segments] == [1, 1]


def test_other_tools_start_a_new_segment_rendered_with_them(qwen_tokenizer):
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    episode, answer = _episode_after_one_call(qwen_tokenizer, tools=[tool])
    other = {"type": "function", "function": {"name": "sub", "parameters": {"type": "object"}}}
    plan, _, _ = _answer(episode, qwen_tokenizer, [SYSTEM, USER, answer, USER], "ok", tools=[other])
    assert plan.split == "tools_changed"
    rendered = qwen_tokenizer.decode(plan.prompt_ids)
    assert '"sub"' in rendered
    assert '"add"' not in rendered


def test_tool_calls_echoed_with_arguments_as_text_extend_the_episode(qwen_tokenizer):
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    episode = EpisodeTokens(TurnTokenizer(qwen_tokenizer))
    plan = episode.plan(canonical_messages([SYSTEM, USER]), canonical_tools([tool]))
    text = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>'
    ids = qwen_tokenizer.encode(text)
    call = {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 12, "b": 30}},
    }
    answer = canonical_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])[0]
    episode.commit(plan, ids, [-0.1] * len(ids), text, answer)
    # what openai-python sends back: content null, arguments as JSON text with its own spacing
    as_text = {"name": "add", "arguments": json.dumps({"b": 30, "a": 12})}
    echoed = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [{**call, "function": as_text}],
    }
    result = {"role": "tool", "tool_call_id": "call_0_0", "content": "42"}
    second = episode.plan(canonical_messages([SYSTEM, USER, echoed, result]), canonical_tools([tool]))
    assert second.split is None
    assert second.prompt_ids[: len(plan.prompt_ids) + len(ids)] == [*plan.prompt_ids, *ids]
    assert "<tool_response>\n42\n</tool_response>" in qwen_tokenizer.decode(second.context_ids)


def test_a_failed_call_changes_nothing(tokenizer):
    episode, answer = _episode_after_one_call(tokenizer)
    more = [SYSTEM, USER, answer, {"role": "user", "content": "more"}]
    plan = episode.plan(canonical_messages(more), None)
    before = list(episode.segments[0].tokens.trajectory.completion_ids)
    assert episode.segments[0].tokens.trajectory.completion_ids == before  # planning appends nothing
    again = episode.plan(canonical_messages(more), None)  # the retry of a call that got no answer
    assert again.split is None
    assert again.prompt_ids == plan.prompt_ids


def test_requests_that_cannot_be_rendered_faithfully_are_refused_with_the_field(tokenizer):
    episode, answer = _episode_after_one_call(tokenizer)
    with pytest.raises(RequestError, match="continuing a partial answer is not supported") as info:
        episode.plan(canonical_messages([SYSTEM, USER, answer]), None)
    assert info.value.param == "messages"
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(RequestError, match=r"messages\[0\]\.content\[0\] is a 'image_url' part") as info:
        canonical_messages([image])
    assert info.value.status == 400
    with pytest.raises(RequestError, match=r"messages\[1\]\.role must be one of"):
        canonical_messages([SYSTEM, {"role": "robot", "content": "hi"}])
    with pytest.raises(RequestError, match="messages must be a non-empty list"):
        canonical_messages([])
    with pytest.raises(RequestError, match=r"tools\[0\] must be"):
        canonical_tools([{"type": "retrieval"}])
    with pytest.raises(RequestError, match=r"messages\[1\]\.tool_calls\[0\] must be"):
        canonical_messages([USER, {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}])


def test_the_canonical_form_drops_sdk_fields_and_reads_developer_as_system():
    got = canonical_messages([
        {"role": "developer", "content": "Be brief.", "annotations": []},
        {"role": "assistant", "content": None, "audio": None, "function_call": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
    ])  # fmt: skip
    assert got == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "content": "ab", "tool_call_id": "c"},
    ]  # fmt: skip


def test_completion_prompts_split_with_the_reason(tokenizer):
    episode = EpisodeTokens(TurnTokenizer(tokenizer))
    prompt = [5, 6, 7]

    def call(ids: list[int], sampled: list[int]):
        plan = episode.plan_completion(ids)
        episode.commit(plan, sampled, [-0.5] * len(sampled), "", {"role": "assistant", "content": ""})
        return plan

    assert call(prompt, [8, 9]).split == ""
    so_far = [5, 6, 7, 8, 9]
    cont = call(so_far, [10])  # equal to everything so far: the answer goes on
    assert (cont.split, cont.context_ids) == (None, [])
    assert call([5, 6, 7, 8, 9, 10], [11]).split is None  # nothing in between: still one sequence
    assert call([5, 6, 7, 8, 9, 10, 11], [12]).split is None
    assert call([5, 6, 7, 8, 9, 10, 11], [13]).split == "resent"  # the previous prompt again
    assert call([5, 6, 99], [1]).split == "history_rewritten@2"
    assert call([5], [2]).split == "history_truncated"
    t = episode.segments[0].tokens.trajectory
    assert (t.prompt_ids, t.completion_ids, t.completion_mask) == (prompt, [8, 9, 10, 11, 12], [1] * 5)


def test_a_text_prompt_sent_again_is_resent(tokenizer):
    episode = EpisodeTokens(TurnTokenizer(tokenizer))
    answer = {"role": "assistant", "content": ""}
    first = episode.plan_completion("The quick brown")
    sampled = tokenizer.encode(" fox")
    episode.commit(first, sampled, [-0.5] * len(sampled), " fox", answer)
    text = tokenizer.decode([*first.prompt_ids, *sampled]) + " jumps"
    second = episode.plan_completion(text)
    assert second.split is None  # everything so far, decoded, then more text
    episode.commit(second, [7], [-0.5], "", answer)
    assert episode.plan_completion(text).split == "resent"
