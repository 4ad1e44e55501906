import pytest

from telescope_rollout import Sample, get_environment
from telescope_rollout.envs import TrajectoryStep
from telescope_rollout.envs.boxed_math import MathEnv
from telescope_rollout.envs.countdown import CountdownEnv, equation_reward, format_reward, safe_eval
from telescope_rollout.envs.quickstart_add import QuickstartAddEnv, score_addition
from telescope_rollout.envs.wordle import WordleEnv, feedback, parse_guess, word_list


# --- countdown -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("x</think><answer>(1 + 2) * 3</answer>", 1.0),
        ("x</think>\n<answer>1+2</answer>\n", 1.0),
        ("x</think><answer>one plus two</answer>", 0.5),
        ("<answer>1+2</answer>", 0.0),  # no </think>
        ("x</think><answer>1</answer> trailing", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_format(completion, expected):
    assert format_reward(completion) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("(95 - 5) / 2 + 1", 1.0),
        ("1 + (95 - 5) / 2", 1.0),
        ("95 - 5 / 2 + 1", 0.0),  # wrong value
        ("(95 - 5) / 2", 0.0),  # misses a number
        ("(95 - 5) / 2 + 1 + 1", 0.0),  # uses 1 twice
        ("__import__('os')", 0.0),
        ("9**9**9", 0.0),
        ("1/0 + 95 + 5 + 2", 0.0),
        ("(" * 150 + "1" + ")" * 150, 0.0),
        ("４６", 0.0),  # fullwidth digits
    ],
)
def test_countdown_equation(answer, expected):
    assert equation_reward(f"<answer>{answer}</answer>", [95, 5, 2, 1], 46) == expected


def test_safe_eval_total():
    assert safe_eval("2*(3+4)") == 14.0
    assert safe_eval("1e309") is None
    assert safe_eval("-(-2)") == 2.0
    assert safe_eval("") is None


async def test_countdown_env_bundled():
    env = get_environment("countdown", dataset="bundled")
    assert isinstance(env, CountdownEnv)
    samples = env.load_dataset(num_samples=5)
    assert len(samples) == 5 == len(env)
    s = samples[0]
    nums = s.metadata["nums"]
    assert str(nums[0]) in s.prompt
    assert s.answer in s.prompt
    r = await env.score("hm</think><answer>0</answer><|endoftext|>", s, eos_token="<|endoftext|>")
    assert r.sample_metrics == {"_format_reward": 1.0, "_equation_reward": 0.0}
    assert r.golden_answers == {"_equation_reward": s.answer}
    assert len(env.load_dataset()) >= 30


# --- math ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hendrycks_math", "dapo_math", "deepscaler"])
async def test_math_envs(name, tokenizer):
    env = get_environment(name, dataset="bundled")
    assert isinstance(env, MathEnv)
    s = env.load_dataset()[0]
    assert s.answer == "39"
    prompt = env.format_prompt(s.prompt, tokenizer)
    assert "\\boxed{}" in prompt
    good = await env.score(f"<think>\\boxed{{1}}</think> so \\boxed{{{s.answer}}}<|im_end|>", s, "<|im_end|>")
    assert good.total_reward == 1.0
    assert good.golden_answers == {"correct": "39"}
    for bad in [
        "\\boxed{38}",
        "39",
        "\\boxed{39",
        "<think>\\boxed{39}</think>",
        "",
        "\\boxed{" + "9" * 600 + "}",
    ]:
        assert (await env.score(bad, s)).total_reward == 0.0


def test_hub_without_datasets_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "datasets":
            raise ImportError("no")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"telescope-rollout\[datasets\]"):
        get_environment("deepscaler").load_dataset(num_samples=2)


# --- quickstart_add ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("42", 1.0),
        (" 42.\n", 1.0),
        ("<think>4+38</think>42", 1.0),
        ("The answer is 42.", 0.5),
        ("42 is the answer, not 41", 0.0),
        ("4 2", 0.0),
        ("forty-two", 0.0),
        ("042", 0.0),  # leading zeros are not the number it asked for
        ("", 0.0),
        ("9" * 100_000, 0.0),
    ],
)
def test_quickstart_scores(completion, reward):
    assert score_addition(completion, "42")[0] == reward


async def test_quickstart_env_deterministic():
    a = get_environment("quickstart_add", num_samples=20, seed=3)
    b = get_environment("quickstart_add", num_samples=20, seed=3)
    assert isinstance(a, QuickstartAddEnv)
    assert [s.prompt for s in a.load_dataset()] == [s.prompt for s in b.load_dataset()]
    s = a.get_sample(0)
    assert isinstance(s.prompt, str)
    assert s.prompt.endswith("Reply with just the number.")
    r = await a.score(s.answer + "<|endoftext|>", s)
    assert r.total_reward == 1.0
    assert r.sample_metrics == {"exact": 1.0, "correct": 1.0}


# --- wordle --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("guess", "secret", "fb"),
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "XXYXY"),
        ("eerie", "there", "YXYXG"),  # one spare e: only the first e is yellow
        ("llama", "hello", "YYXXX"),
        ("zzzzz", "crane", "XXXXX"),
    ],
)
def test_wordle_feedback(guess, secret, fb):
    assert feedback(guess, secret) == fb


def test_wordle_parse_and_words():
    assert parse_guess("<think><guess>wrong</guess></think> <guess>[Crane]</guess>") == "crane"
    assert parse_guess("no tag") is None
    assert parse_guess("<guess></guess>") == ""
    words = word_list()
    assert len(words) > 300
    assert all(len(w) == 5 for w in words)


def _say(state, text):
    state.trajectory.append(TrajectoryStep(prompt=[], completion=[{"role": "assistant", "content": text}]))
    return [{"role": "assistant", "content": text}]


async def test_wordle_game_solved():
    env = get_environment("wordle", num_samples=3)
    assert isinstance(env, WordleEnv)
    s = env.load_dataset()[0]
    state = env.create_initial_state(s)
    assert env.get_initial_prompt(s)[0]["role"] == "system"
    first = "abcde" if s.answer != "abcde" else "vwxyz"
    reply, done, _ = await env.step(_say(state, f"<guess>[{first}]</guess>"), state)
    assert not done
    assert "You have 5 guesses left." in reply[0]["content"]
    reply, done, reason = await env.step(_say(state, f"<guess>{s.answer}</guess>"), state)
    assert done
    assert reason == "game_over"
    assert "Solved" in reply[0]["content"]
    r = await env.score(state)
    m = r.sample_metrics
    assert m["_reward_correct"] == 1.0
    assert m["_reward_length"] == 0.5
    assert m["_reward_partial"] == 0.0
    assert m["format_reward"] == 1.0
    assert r.total_reward == pytest.approx(1.0 + 0.5 + 0.2)
    assert r.golden_answers["_reward_correct"] == s.answer


async def test_wordle_invalid_moves_and_turn_limit():
    env = get_environment("wordle", num_samples=1, max_turns=3)
    assert isinstance(env, WordleEnv)
    s = Sample("Make your first guess.", "crane")
    state = env.create_initial_state(s)
    reply, done, _ = await env.step(_say(state, "I think CRANE"), state)
    assert not done
    assert "Invalid move" in reply[0]["content"]
    reply, done, reason = await env.step(_say(state, "<guess>toolong</guess>"), state)
    assert done
    assert reason == "game_over"
    r = await env.score(state)
    assert r.sample_metrics["_reward_correct"] == 0.0

    state = env.create_initial_state(s)
    for word in ["track", "brace", "grace"]:
        reply, done, reason = await env.step(_say(state, f"<guess>{word}</guess>"), state)
    assert done
    assert reason in ("game_over", "max_turns_reached")
    r = await env.score(state)
    # last feedback grace vs crane: XGGYG -> 3 G, 1 Y -> 0.2*3 + 0.1*1 = 0.7
    assert r.sample_metrics["_reward_partial"] == pytest.approx(0.7)
