from telescope_rollout.chat import MultiTurnTokens, TurnTokenizer

CONVO = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Guess a five letter word"},
]
TURNS = [
    ("<guess>crane</guess>", [{"role": "user", "content": "C R A N E\nX Y X G X\nrésumé 🙂"}]),
    (
        " The answer is 42.",
        [{"role": "user", "content": "What is 12 + 30?"}, {"role": "user", "content": "again"}],
    ),
    ("東京", []),
]


def _play(tokenizer, model_ids_for):
    tt = TurnTokenizer(tokenizer)
    mt = MultiTurnTokens(tt, CONVO)
    assistant_spans = []
    for text, env_msgs in TURNS:
        ids = model_ids_for(text)
        start = len(mt.trajectory.completion_ids)
        mt.add_model_turn(ids, [-0.5] * len(ids), text=text)
        assistant_spans.append((start, start + len(ids)))
        if env_msgs:
            mt.add_env_turn(env_msgs)
    return mt, assistant_spans


def test_ids_equal_full_rendering_and_mask_marks_assistant(tokenizer):
    eos = tokenizer.eos_token_id
    mt, spans = _play(tokenizer, lambda text: [*tokenizer.encode(text), eos])
    t = mt.trajectory
    # The whole conversation, rendered by the template and tokenized at once: token for token the same.
    messages = [*CONVO]
    for text, env_msgs in TURNS:
        messages += [{"role": "assistant", "content": text}, *env_msgs]
    full = tokenizer.apply_chat_template(messages, tokenize=True)
    ours = t.prompt_ids + t.completion_ids
    assert ours == full[: len(ours)]
    assert tokenizer.decode(full[len(ours) :]) == "\n"  # the template's closing newline, not generated yet
    # The mask is 1 on exactly the model's tokens (content + its own <|im_end|>).
    ones = [i for i, m in enumerate(t.completion_mask) if m]
    assert ones == [i for a, b in spans for i in range(a, b)]
    assert len(t.completion_mask) == len(t.completion_ids) == len(t.completion_logprobs)
    assert all(lp == -0.5 for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(t.completion_logprobs, t.completion_mask, strict=True) if not m)
    # Before the last model turn, the prompt the server sees equals re-rendering with a generation prompt.
    assert mt.check_prefix() is False  # the last turn is open (no env reply): no generation prompt to compare


def test_prefix_matches_rerender_after_env_turn(tokenizer):
    eos = tokenizer.eos_token_id
    tt = TurnTokenizer(tokenizer)
    mt = MultiTurnTokens(tt, CONVO)
    mt.add_model_turn([*tokenizer.encode("hello"), eos], text="hello")
    nxt = mt.add_env_turn([{"role": "user", "content": "more"}])
    assert nxt == tokenizer.apply_chat_template(
        [*CONVO, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}],
        tokenize=True,
        add_generation_prompt=True,
    )
    assert mt.check_prefix()


def test_model_tokens_never_retokenized(tokenizer):
    # Non-canonical tokenization of "crane": one byte-level token per character.
    odd = [tokenizer.token_to_id(c) for c in "crane"]
    assert odd != tokenizer.encode("crane")
    tt = TurnTokenizer(tokenizer)
    mt = MultiTurnTokens(tt, CONVO)
    mt.add_model_turn([*odd, tokenizer.eos_token_id], text="crane")
    nxt = mt.add_env_turn([{"role": "user", "content": "ok"}])
    n = len(mt.trajectory.prompt_ids)
    assert nxt[n : n + 6] == [*odd, tokenizer.eos_token_id]


def test_truncated_turn_gets_the_closing_suffix(tokenizer):
    tt = TurnTokenizer(tokenizer)
    assert tokenizer.decode(tt.suffix_ids) == "<|im_end|>\n"
    mt = MultiTurnTokens(tt, CONVO)
    ids = tokenizer.encode("cut off")  # no EOS: hit max_tokens
    mt.add_model_turn(ids, text="cut off")
    mt.add_env_turn([{"role": "user", "content": "go on"}])
    t = mt.trajectory
    closing = t.completion_ids[len(ids) : len(ids) + 2]
    assert closing == tt.suffix_ids
    assert t.completion_mask[len(ids) : len(ids) + 2] == [0, 0]
