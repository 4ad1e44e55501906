"""Multi-turn token reuse with a Qwen3-style reasoning template (fixtures/qwen3_like.jinja).

The expected texts below are written out by hand from the template's rules, not produced by the
code under test.
"""

import pytest

from telescope_rollout.chat import MultiTurnTokens, TurnTokenizer

CONVO = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Guess a five letter word"},
]
THINKING_TURNS = [
    ("<think>\nplan A\n</think>\n\n<guess>crane</guess>", [{"role": "user", "content": "X Y X G X"}]),
    ("<think>\nplan B é\n</think>\n\n<guess>fox</guess>", [{"role": "user", "content": "again 🙂"}]),
    ("<think>\nplan C\n</think>\n\nThe answer is 42.", []),
]
# Hand-written: every model turn exactly as generated (reasoning included), every env turn framed
# by the template, each assistant turn closed by the model's own <|im_end|>.
EXPECTED_OURS = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nGuess a five letter word<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nplan A\n</think>\n\n<guess>crane</guess><|im_end|>\n"
    "<|im_start|>user\nX Y X G X<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nplan B é\n</think>\n\n<guess>fox</guess><|im_end|>\n"
    "<|im_start|>user\nagain 🙂<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nplan C\n</think>\n\nThe answer is 42.<|im_end|>"
)
# Hand-written: the template re-rendering the finished conversation drops the reasoning of the two
# turns before the last user query and keeps the final turn's.
EXPECTED_RERENDER = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nGuess a five letter word<|im_end|>\n"
    "<|im_start|>assistant\n<guess>crane</guess><|im_end|>\n"
    "<|im_start|>user\nX Y X G X<|im_end|>\n"
    "<|im_start|>assistant\n<guess>fox</guess><|im_end|>\n"
    "<|im_start|>user\nagain 🙂<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nplan C\n</think>\n\nThe answer is 42.<|im_end|>\n"
)


def _play(tok, turns, kwargs=None, model_ids=None):
    model_ids = model_ids or (lambda text: [*tok.encode(text), tok.eos_token_id])
    mt = MultiTurnTokens(TurnTokenizer(tok, kwargs), CONVO)
    spans, statuses = [], []
    for text, env_msgs in turns:
        ids = model_ids(text)
        start = len(mt.trajectory.completion_ids)
        mt.add_model_turn(ids, [-0.25] * len(ids), text=text)
        spans.append((start, start + len(ids)))
        if env_msgs:
            mt.add_env_turn(env_msgs)
            statuses.append(mt.prefix_status())
    return mt, spans, statuses


def _messages(turns):
    out = list(CONVO)
    for text, env_msgs in turns:
        out += [{"role": "assistant", "content": text}, *env_msgs]
    return out


def _assert_mask(mt, spans):
    t = mt.trajectory
    assert len(t.completion_ids) == len(t.completion_mask) == len(t.completion_logprobs)
    assert [i for i, m in enumerate(t.completion_mask) if m] == [i for a, b in spans for i in range(a, b)]
    assert {lp for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if m} == {-0.25}
    assert {lp for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if not m} <= {0.0}


def test_thinking_template_keeps_every_turns_reasoning(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tok.encode("<think>") == [tok.token_to_id("<think>")]  # an added token, as in Qwen3
    mt, spans, statuses = _play(tok, THINKING_TURNS)
    t = mt.trajectory
    ours = t.prompt_ids + t.completion_ids
    assert tok.decode(ours) == EXPECTED_OURS
    assert ours == tok.encode(EXPECTED_OURS)
    _assert_mask(mt, spans)
    # Each masked span is exactly one model turn, reasoning included.
    for (a, b), (text, _) in zip(spans, THINKING_TURNS, strict=True):
        assert tok.decode(t.completion_ids[a:b]) == text + "<|im_end|>"

    # Where they should, ids equal the template's rendering of the whole conversation: everything
    # except the reasoning of turns before the last user query, which the template drops.
    full_text = tok.apply_chat_template(_messages(THINKING_TURNS))
    assert full_text == EXPECTED_RERENDER
    dropped = [tok.encode("<think>\nplan A\n</think>\n\n"), tok.encode("<think>\nplan B é\n</think>\n\n")]
    without = list(ours)
    for (a, _), drop in sorted(zip(spans, dropped, strict=False), reverse=True):
        pos = len(t.prompt_ids) + a
        assert without[pos : pos + len(drop)] == drop
        del without[pos : pos + len(drop)]
    full = tok.encode(full_text)
    assert without == full[: len(without)]
    assert tok.decode(full[len(without) :]) == "\n"  # the template's closing newline, not generated

    # Each env reply is a new user query, so from turn 2 on the re-rendered prompt lacks the earlier
    # reasoning: a known, harmless difference, not a mismatch. (Tool replies are not queries: see
    # test_native_tools.py, where the re-rendering stays exact.)
    assert statuses == ["reasoning_dropped", "reasoning_dropped"]
    assert mt.check_prefix() is False  # the final turn is open: no generation prompt to compare with


def test_thinking_disabled_empty_think_block_is_context(qwen_tokenizer):
    tok = qwen_tokenizer
    turns = [("<guess>crane</guess>", [{"role": "user", "content": "X Y X G X"}]), ("42", [])]
    mt, spans, statuses = _play(tok, turns, {"enable_thinking": False})
    t = mt.trajectory
    ours = t.prompt_ids + t.completion_ids
    empty = "<think>\n\n</think>\n\n"
    assert tok.decode(ours) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nGuess a five letter word<|im_end|>\n"
        f"<|im_start|>assistant\n{empty}<guess>crane</guess><|im_end|>\n"
        "<|im_start|>user\nX Y X G X<|im_end|>\n"
        f"<|im_start|>assistant\n{empty}42<|im_end|>"
    )
    _assert_mask(mt, spans)
    # The empty think blocks come from generation prompts: context, never trained on.
    think_id = tok.token_to_id("<think>")
    assert all(m == 0 for i, m in zip(t.completion_ids, t.completion_mask, strict=True) if i == think_id)
    # The re-rendering leaves the first turn's empty block out; the final turn keeps one.
    rerender = tok.apply_chat_template(_messages(turns), enable_thinking=False)
    assert rerender.count(empty) == 1
    assert statuses == ["reasoning_dropped"]


def test_prefix_status_tells_real_mismatches_apart(qwen_tokenizer, tokenizer):
    tok = qwen_tokenizer
    # Non-canonical model tokens (one per character): kept as sampled, same text.
    odd = [tok.token_to_id(c) for c in "crane"]
    mt, _, statuses = _play(
        tok,
        [("crane", [{"role": "user", "content": "ok"}])],
        model_ids=lambda text: [*odd, tok.eos_token_id],
    )
    assert statuses == ["same_text"]
    assert mt.check_prefix()
    # The text the model produced is not what the messages say: a real mismatch.
    mt = MultiTurnTokens(TurnTokenizer(tok), CONVO)
    mt.add_model_turn([*tok.encode("crane"), tok.eos_token_id], text="slate")
    mt.add_env_turn([{"role": "user", "content": "ok"}])
    assert mt.prefix_status() == "mismatch"
    assert mt.check_prefix() is False


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_truncated_thinking_turn_is_closed_by_the_template(qwen_tokenizer, enable_thinking):
    tok = qwen_tokenizer
    kwargs = None if enable_thinking is None else {"enable_thinking": enable_thinking}
    tt = TurnTokenizer(tok, kwargs)
    assert tok.decode(tt.suffix_ids) == "<|im_end|>\n"
    mt = MultiTurnTokens(tt, CONVO)
    cut = tok.encode("<think>\nstill thinking")  # max_tokens hit inside the reasoning
    mt.add_model_turn(cut, text="<think>\nstill thinking")
    nxt = mt.add_env_turn([{"role": "user", "content": "go on"}])
    tail = tok.decode(nxt[len(mt.trajectory.prompt_ids) :])
    gen = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if enable_thinking is False else "")
    assert tail == f"<think>\nstill thinking<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n{gen}"
